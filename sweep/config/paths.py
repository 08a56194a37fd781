"""Names that become path components, and paths that must stay inside their root.

On a shared ``results.root`` a name from the command line (``search.name``, ``sweep.name``,
``run_id``, a model label) becomes a directory or a file name. ``check_name`` is the one
rule for such a name: a conservative character set, no leading dot (hidden files are never
read back), never ``.`` or ``..``. ``inside`` is the one check that a path the tool is about
to write resolves under its root (symlinks included), and ``check_tree`` the same for a directory
another program writes (Ray Tune's experiment, the Optuna study). ``check_writable_dir`` is the one
check, before any work and creating nothing, that an output directory (``results.root``,
``sweep.storage``, ``analysis.out``) is a directory the tool can write into or create. ``read_path`` is the one
reading of a path a user wrote (``PATH_KEYS``): ``~`` and environment variables expanded once, made absolute and
resolved once (a root that is itself a symbolic link is read as the directory it names), at validation; every
command then checks and writes that one path.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.errors import ConfigError

if TYPE_CHECKING:
    from sweep.config import Config

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_ALLOWED = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def is_name(value: str) -> bool:
    """A safe path component: ``NAME_RE`` (which already excludes ``.``, ``..`` and a leading dot)."""
    return isinstance(value, str) and bool(NAME_RE.match(value))


def check_name(key: str, value: str) -> str:
    """``value`` if it is a safe path component, else a ConfigError naming ``key``."""
    if not is_name(value):
        raise ConfigError(f"{key}={value!r}: must be {NAME_ALLOWED} (it becomes a file or directory name)")
    return value


# every config key that holds a path (the gate's published skip set, ``gate.skip=file:PATH``, is read once, at
# validation, by ``sweep.gates.skipset``): read by ``read_path`` when the config is validated
PATH_KEYS = (
    "results.root",
    "sweep.storage",
    "analysis.out",
    "fit.out",
    "model.path",
    "prompts.path",
    "gate.readouts",
    "profile.readouts",
    "eval.harness_include",
)


def read_path(key: str, text: str) -> str:
    """The one reading of the path ``text`` that config key ``key`` holds: ``~`` and environment variables
    expanded once (a variable that is not set is a ConfigError naming it), made absolute against the working
    directory and resolved (symbolic links followed; a dangling one is a ConfigError). What every command then
    checks and writes, and what a sweep's driver hands its workers, wherever they run."""
    from sweep.userfiles import expand, unset

    check_dir_path(key, text)
    missing = unset(text)
    if missing:
        raise ConfigError(f"{key}={text}: the environment variable {missing[0]} is not set")
    path = Path(expand(text)).absolute()
    probe = path
    while not os.path.exists(probe) and probe != probe.parent:  # (False for a path too long to be a file)
        if os.path.islink(probe):
            raise ConfigError(f"{key}={text}: {probe} is a dangling symbolic link; point {key} at what exists")
        probe = probe.parent
    return str(path.resolve())


def read_value(key: str, value):
    """A setting's value as this process reads it, for a worker that composes it in a directory of its own: a path
    key's path read (``read_path``; ``model.path`` only where it names a path, not a hub id), a published skip set's
    path (``gate.skip=file:PATH``) made absolute here with ``~`` and set variables expanded; any other value as it
    is."""
    from sweep.userfiles import expand

    if not isinstance(value, str):
        return value
    if key in PATH_KEYS and (key != "model.path" or names_a_path(value) or os.path.exists(value)):
        return read_path(key, value)
    if key == "gate.skip" and value.strip().startswith("file:"):
        return "file:" + os.path.abspath(expand(value.strip()[len("file:") :]))
    return value


def read_paths(cfg: Config) -> Config:
    """``cfg`` with every path it holds (``PATH_KEYS``) read once (``read_path``: expanded, absolute, resolved), the
    path every command then checks and writes; ``model.path`` only where it names a local file or directory, not a
    hub id (org/name). Reading a path already read gives it back unchanged."""
    import dataclasses

    for key in PATH_KEYS:
        section, _, leaf = key.partition(".")
        part = getattr(cfg, section)
        value = getattr(part, leaf)
        if value is None or (key == "model.path" and not _local(cfg.model)):
            continue
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(part, **{leaf: read_path(key, value)})})
    return cfg


def override_key(override: str) -> str:
    """The config key a Hydra override sets, adds or deletes: ``+gate.eps=0.1`` and ``~gate.eps`` are ``gate.eps``."""
    return str(override).partition("=")[0].lstrip("+~")


def read_overrides(overrides: list[str] | tuple[str, ...], cfg: Config) -> list[str]:
    """``overrides`` with each path key they set (``PATH_KEYS``) set to the path ``cfg`` read from it
    (``read_paths``), quoted for Hydra: what a sweep's driver hands its workers, so that a worker reads the very path
    the driver checked, whatever its working directory, home or environment."""
    out = []
    for o in overrides:
        key, eq, _ = str(o).partition("=")
        bare = key.lstrip("+")
        if eq and not key.startswith("~") and bare in PATH_KEYS:
            section, _, leaf = bare.partition(".")
            value = getattr(getattr(cfg, section), leaf)
            o = f"{key}={quoted(value)}" if value is not None else o
        out.append(o)
    return out


def quoted(text: str) -> str:
    """``text`` as a quoted string of Hydra's override grammar, which reads back as ``text``: quotes escaped, and
    the backslashes before a quote or the end doubled."""
    body = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + body.replace("'", "\\'") + "'"


def _local(model) -> bool:
    """Whether ``model.path`` names a local path (always for a GGUF file), not a hub id."""
    text = model.path
    return model.source != "hf" or names_a_path(text) or os.path.exists(text)


def names_a_path(text: str) -> bool:
    """Whether a ``model.path`` that does not exist still names a file or directory, not a hub id (org/name): it
    starts with ``.``, ``/``, ``~`` or ``$``, or has more than one ``/``. The one rule the path reader and the loader
    share."""
    return text.startswith((".", "/", "~", "$")) or text.count("/") > 1


def inside(root: str | Path, path: str | Path, *, key: str = "results.root") -> Path:
    """``path`` resolved, if it lies under ``root`` resolved; else a ConfigError naming ``key``."""
    base = Path(root).expanduser().resolve()
    target = Path(path).expanduser().resolve()
    if target != base and base not in target.parents:
        raise ConfigError(f"{key}={root}: refusing to write {path}, which resolves to {target}, outside it")
    return target


def check_tree(root: str | Path, directory: str | Path, *, key: str) -> Path:
    """``directory`` resolved, if it and every link and file under it stay inside ``root``: a symbolic
    link planted there that resolves elsewhere, or a file with several hard links (another name
    for a file elsewhere), would make the program writing there (Tune, SQLite) write outside the
    root. A ConfigError naming ``key`` otherwise, before anything is written."""
    target = inside(root, directory, key=key)
    for dirpath, dirnames, filenames in os.walk(directory):  # links are checked, not followed
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                inside(root, path, key=key)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise ConfigError(
                    f"{key}={root}: refusing to write {path}, which has {st.st_nlink} hard links (another name for a "
                    "file elsewhere); remove it"
                )
    return target


def check_dir_path(key: str, path: str) -> str:
    """``path`` if it is usable as a directory path at all (non-empty, no NUL), else a ConfigError."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise ConfigError(f"{key}={path!r}: must be a non-empty directory path")
    return path


_BELOW = 512  # characters the tool's own files under an output directory may add to its path


def _check_length(key: str, path: str | Path, target: Path) -> None:
    """Each component within the filesystem's NAME_MAX and the whole within PATH_MAX (less what the
    tool writes under it): otherwise the first write fails with ENAMETOOLONG after the work is done."""
    probe = target
    while not os.path.exists(probe) and probe != probe.parent:  # (False for a name too long)
        probe = probe.parent
    try:
        name_max, path_max = os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    long = next((part for part in target.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise ConfigError(
            f"{key}={path}: the component {long[:40]}... is {len(os.fsencode(long))} bytes, over this filesystem's "
            f"limit of {name_max} for a name"
        )
    if len(os.fsencode(str(target))) > path_max - _BELOW:
        raise ConfigError(
            f"{key}={str(path)[:60]}...: {len(os.fsencode(str(target)))} bytes long; at most {path_max - _BELOW} "
            f"(the filesystem's {path_max} less room for the files written under it)"
        )


def check_writable_dir(key: str, path: str | Path) -> Path:
    """The directory ``path`` (``~`` expanded) if the tool can write into it, creating nothing.

    It exists as a writable directory, or it can be created: its first existing ancestor is
    a writable directory. A file at ``path`` or above it, or an ancestor without write (and
    search) permission, is a ConfigError naming ``key``, before any work starts."""
    check_dir_path(key, str(path))
    target = Path(path).expanduser().absolute()
    _check_length(key, path, target)
    probe = target
    while not os.path.exists(probe):  # False, not an error, for a path under a file or a closed directory
        if os.path.islink(probe):  # a dangling link: creating it would write where it points
            raise ConfigError(f"{key}={path}: {probe} is a dangling symbolic link; point {key} at a directory")
        probe = probe.parent
    if not os.path.isdir(probe):
        where = "is a file" if probe == target else f"lies under {probe}, which is a file"
        raise ConfigError(f"{key}={path}: {where}, not a directory; {key} must be a directory (or one to create)")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "the directory is not writable" if probe == target else f"cannot be created: {probe} is not writable"
        raise ConfigError(f"{key}={path}: {what} (no write permission); {key} must be a directory you can write to")
    if probe != target:  # to be created: the bits can say yes where the filesystem says no (/proc); asked for real
        import tempfile  # (not in a directory that exists: an entry made and removed there would change its mtime)

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".sweep-probe-", dir=probe))
        except OSError as exc:
            raise ConfigError(
                f"{key}={path}: cannot be created: {probe} takes no new entry ({exc.strerror or exc}); {key} must be "
                "a directory you can write to"
            ) from None
    return target
