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
_MAX_FILES = 2000  # a config directory with more files (or bytes) than this is not hashed: composed every time
_MAX_BYTES = 16 * 2**20

_kept: OrderedDict[tuple, dict[str, Any]] = OrderedDict()


def conf_digest(conf_dir: Path) -> str | None:
    """A hash of every file's path and content under ``conf_dir`` (links followed, as Hydra follows them); None
    where that is not cheap or not possible (too many files or bytes, a loop of links, an unreadable file). Only
    regular files are read: a FIFO or socket there adds its name and kind, never blocks."""
    h = hashlib.sha256()
    files = size = 0
    try:
        for root, dirs, names in os.walk(conf_dir, followlinks=True, onerror=_raise):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                files += 1
                st = os.stat(path)
                h.update(os.path.relpath(path, conf_dir).encode("utf-8", "surrogateescape") + b"\0")
                if not stat.S_ISREG(st.st_mode):
                    h.update(f"kind {stat.S_IFMT(st.st_mode)}\0".encode())
                    continue
                size += st.st_size
                if files > _MAX_FILES or size > _MAX_BYTES:
                    return None
                with open(path, "rb") as f:
                    h.update(f.read(_MAX_BYTES + 1))
                h.update(b"\0")
            if files > _MAX_FILES:
                return None
    except OSError:
        return None
    return h.hexdigest()


def _raise(exc: OSError) -> None:
    raise exc


def composed(conf_dir: Path, overrides, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``make()``'s composition of ``overrides`` over ``conf_dir``, from this process's memo when the same overrides
    met the same files before; the caller gets its own copy either way. What ``make`` raises is raised, not kept."""
    digest = conf_digest(conf_dir)
    if digest is None:
        return make()
    key = (str(conf_dir), digest, tuple(str(o) for o in overrides))
    hit = _kept.get(key)
    if hit is None:
        hit = make()
        _kept[key] = copy.deepcopy(hit)
        if len(_kept) > _KEPT:
            _kept.popitem(last=False)
        return hit
    _kept.move_to_end(key)
    return copy.deepcopy(hit)
