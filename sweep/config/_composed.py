"""The config directory, and Hydra's compositions of it kept in this process: the same overrides over the same
conf/ files compose once.

A composition costs tens of milliseconds (Hydra reads and merges a dozen YAML files); a sweep composes each trial's
settings when it plans them and again where they run, and a test session thousands of times. The key is the
overrides and the content of every file under the config directory, so an edited, added or removed conf file (even
one rewritten within the same clock tick) composes afresh. A directory too large to hash cheaply, or one that cannot
be read whole, is composed every time."""

from __future__ import annotations

import copy
import hashlib
import os
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from sweep.errors import ConfigError

CONFIG_DIR_ENV = "SWEEP_CONFIG_DIR"


def config_dir() -> Path:
    """conf/ of this checkout, or ``$SWEEP_CONFIG_DIR`` when set."""
    env = os.environ.get(CONFIG_DIR_ENV)
    path = Path(env).expanduser().absolute() if env else Path(__file__).resolve().parents[2] / "conf"
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"{CONFIG_DIR_ENV}: no config.yaml in {path}; point it at the project's conf/ directory")
    return path


_KEPT = 256  # compositions kept, the least recently used dropped first
_MAX_FILES = 2000  # a config directory with more entries (or bytes) than this is not hashed: composed every time
_MAX_BYTES = 16 * 2**20

_kept: OrderedDict[tuple, dict[str, Any]] = OrderedDict()


def conf_digest(conf_dir: Path) -> str | None:
    """A hash of every file's path and content under ``conf_dir`` (links followed, as Hydra follows them); None
    where that is not cheap or not possible (too many files, directories or bytes, a directory reached twice, as a
    loop of links does, an unreadable file). Only regular files are read: a FIFO or socket there adds its name and
    kind, never blocks."""
    h = hashlib.sha256()
    entries = size = 0
    seen: set[tuple[int, int]] = set()
    try:
        for root, dirs, names in os.walk(conf_dir, followlinks=True, onerror=_raise):
            here = os.stat(root)
            entries += 1 + len(names)
            if (here.st_dev, here.st_ino) in seen or entries > _MAX_FILES:
                return None
            seen.add((here.st_dev, here.st_ino))
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                st = os.stat(path)
                h.update(os.path.relpath(path, conf_dir).encode("utf-8", "surrogateescape") + b"\0")
                if not stat.S_ISREG(st.st_mode):
                    h.update(f"kind {stat.S_IFMT(st.st_mode)}\0".encode())
                    continue
                size += st.st_size
                if size > _MAX_BYTES:
                    return None
                with open(path, "rb") as f:
                    h.update(f.read(_MAX_BYTES + 1))
                h.update(b"\0")
    except OSError:
        return None
    return h.hexdigest()


def _raise(exc: OSError) -> None:
    raise exc


def _keyable(overrides) -> bool:
    """Whether the overrides' text alone says what they compose to: not where a value interpolates
    (``${oc.env:...}``, ``${now:...}``: the environment, the clock) or a key is Hydra's own (``hydra.searchpath``
    reads files outside the config directory)."""
    for o in overrides:
        text = str(o)
        if "${" in text or text.lstrip("+~").startswith("hydra"):
            return False
    return True


def composed(conf_dir: Path, overrides, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``make()``'s composition of ``overrides`` over ``conf_dir``, from this process's memo when the same overrides
    met the same files before; the caller gets its own copy either way. What ``make`` raises is raised, not kept;
    a composition during which a conf file changed is not kept either."""
    digest = conf_digest(conf_dir) if _keyable(overrides) else None
    if digest is None:
        return make()
    key = (str(conf_dir), digest, tuple(str(o) for o in overrides))
    hit = _kept.get(key)
    if hit is None:
        hit = make()
        if conf_digest(conf_dir) == digest:
            _kept[key] = copy.deepcopy(hit)
            if len(_kept) > _KEPT:
                _kept.popitem(last=False)
        return hit
    _kept.move_to_end(key)
    return copy.deepcopy(hit)
