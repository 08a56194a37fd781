"""Names that become path components, and paths that must stay inside their root.

On a shared ``results.root`` a name from the command line (``search.name``, ``sweep.name``,
``run_id``, a model label) becomes a directory or a file name. ``check_name`` is the one
rule for such a name: a conservative character set, no leading dot (hidden files are never
read back), never ``.`` or ``..``. ``inside`` is the one check that a path the tool is about
to write resolves under its root (symlinks included), and ``check_tree`` the same for a directory
another program writes (Ray Tune's experiment, the Optuna study). ``check_writable_dir`` is the one
check, before any work and creating nothing, that an output directory (``results.root``,
``sweep.storage``, ``analysis.out``) is a directory the tool can write into or create.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from sweep.errors import ConfigError

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
    return target
