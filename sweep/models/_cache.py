"""Model files checked before they are loaded: safetensors headers, and the manifest of a GGUF
conversion cache entry.

A safetensors file starts with an 8-byte little-endian header length, the JSON header (each
tensor's byte range), then the tensors: a file cut short, or garbage, no longer covers the
ranges its header names, and is named before transformers reports it without a path. A
conversion cache entry (``sweep.models._loader``) records every file's size and sha256 in its
completion marker when it is written; an entry whose files no longer match is rebuilt. One process
on a machine converts a given file at a time (``converting``): another that needs it waits, then reads
the entry the first wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import struct
from pathlib import Path

log = logging.getLogger("sweep.models._cache")

MANIFEST_VERSION = 1
_HEADER_MAX = 100 * 2**20  # safetensors' own bound on the JSON header


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (cut short, padded, garbage); None when its
    header is readable and its tensors' byte ranges cover the file exactly."""
    from sweep.userfiles import NotData, kind, parse_json

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO planted among the weights would block the read: never opened
            return f"{kind(st.st_mode)}, not a regular file"
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(_HEADER_MAX, size - 8):
                return f"its header claims {n} bytes, the file has {size}: cut short or not safetensors"
            header = parse_json(f.read(n))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except NotData as exc:
        return f"its header is {exc}: not safetensors"
    except (ValueError, UnicodeDecodeError):
        return "its header is not JSON: corrupt or not safetensors"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"tensor {name[:60]} has no byte range in the header"
        end = max(end, offsets[1])
    if 8 + n + end != size:
        return f"its tensors need {8 + n + end} bytes, the file has {size}: cut short or padded"
    return None


def weights_problem(directory: Path) -> str | None:
    """The first safetensors file under ``directory`` that is not whole, with why; None when all are."""
    for path in sorted(directory.glob("*.safetensors")):
        why = safetensors_problem(path)
        if why is not None:
            return f"{path} is truncated or corrupt ({why})"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * 2**20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path, marker: str) -> None:
    """Record each file of ``directory`` (its size and sha256) in ``directory/marker``, written last."""
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != marker
    }
    (directory / marker).write_text(json.dumps({"version": MANIFEST_VERSION, "files": files}, indent=1) + "\n")


def entry_problem(directory: Path, marker: str) -> str | None:
    """Why the cache entry ``directory`` cannot be trusted (no marker, an older unverified marker, a
    file missing, of another size or another hash); None when every recorded file matches."""
    from sweep.userfiles import read_json

    try:
        record = read_json(directory / marker)  # a regular file of a capped size, JSON of bounded depth
    except FileNotFoundError:
        return f"no {marker}: the entry was never completed"
    except (OSError, ValueError):
        return f"its {marker} is not a manifest (an entry written before entries were verified)"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files or record.get("version") != MANIFEST_VERSION:
        return f"its {marker} is not a manifest of version {MANIFEST_VERSION}"
    for name, want in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if not isinstance(want, dict) or size != want.get("size"):
            return f"{path} has {size} bytes, {want.get('size') if isinstance(want, dict) else '?'} were written"
        if _sha256(path) != want.get("sha256"):
            return f"{path} changed since it was written (sha256 differs)"
    return None


@contextlib.contextmanager
def converting(entry: Path, label: str):
    """Held while this process converts what ``entry`` will hold: an exclusive lock on a file of the entry's name in
    ``<entries>.locks`` beside the directory of entries (its real path: a cache directory reached through a link
    shares the locks of its target), so that two workers loading the same model for the first time on one machine
    convert it once (the second waits for the first, then finds the entry). The holder writes its pid there, and
    a waiter names it. The kernel releases the lock when its holder ends, however it ends. Where the lock cannot be
    taken (a cache directory that is read-only, a link planted at the lock file's name, a filesystem without locks)
    the conversion goes on without it, as it would with the cache unwritable."""
    fd = _locked(entry, label)
    if fd is not None:
        with contextlib.suppress(OSError):  # a lock file opened read-only (another user's) keeps its holder's pid
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
    try:
        yield
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _locked(entry: Path, label: str) -> int | None:
    """The lock file of ``entry``, open (read-write, else read-only: flock needs neither) and locked, after waiting
    for another holder; None, after saying why, where it cannot be."""
    fd = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        entries = entry.parent.resolve()
        locks = entries.with_name(f"{entries.name}.locks")
        locks.mkdir(exist_ok=True)
        path = locks / f"{entry.name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning(
                "%s: another process on this machine (pid %s) is converting it; waiting for it to finish",
                label,
                _holder(fd),
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        log.info("converting %s without a lock (%s)", label, exc.strerror or exc)
        return None


def _holder(fd: int) -> str:
    """The pid the lock's holder wrote in its file."""
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    except OSError:  # a FIFO planted at the lock's name: no pid to read
        return "unknown"
