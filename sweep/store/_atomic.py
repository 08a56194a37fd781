"""Atomic, durable file writes: a reader sees a whole file or none."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from sweep.store._guard import temp_path


def atomic_write(path: Path, write: Callable[[Path], object], *, exclusive: bool = False, durable: bool = True) -> Path:
    """The one way the project writes a file a reader may see: ``write(tmp)`` to a hidden temporary name
    in the same directory (``_guard.temp_path``: host and pid in it), then fsync it, then rename it into
    place (``exclusive``: link it, never replacing a file another writer put there first, whose
    FileExistsError propagates) and fsync the directory. A reader sees the whole file or none; the
    temporary never outlives the call. ``durable=False`` skips the fsyncs (a rebuildable cache)."""
    tmp = temp_path(path)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path
