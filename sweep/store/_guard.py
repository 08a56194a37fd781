"""Safety on a shared ``results.root``: which files a reader may trust, and the temporary
files a killed writer left behind.

Many people and jobs write one root. A file there may be unreadable (a copy cut short,
garbage), or valid Parquet of someone else's (another table's, another tool's). Such a file
is named in one warning (logger ``sweep.store``) and skipped; the command goes on with the
rest. The check reads only the file's footer (schema and key-value metadata) and is cached
by (path, mtime, size), so a rescan costs one ``stat`` per file.

A writer writes ``.<stem>~<host>~<pid>~<hex>.tmp`` and renames it into place; one killed
mid-write leaves that file behind. The next writer of the directory removes it: at once when
it was written on this host (same host name and pid namespace) by a process that is gone,
otherwise once it is older than ``STALE_AFTER_S`` (a write takes seconds). A name that looks like
one but names no writer there could have (a pid no system has: planted) is logged once and left
until it is that old; nothing found in a directory ever stops its writer.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from sweep.store._columns import SCHEMA_VERSION, Table

log = logging.getLogger("sweep.store")

STALE_AFTER_S = 3600.0  # a temporary file from another host (or an unknown writer) older than this is an orphan

_TEMP_RE = re.compile(r"^\.(?P<stem>.+)~(?P<host>[^~]+)~(?P<pid>\d+)~(?P<hex>[0-9a-f]+)\.tmp$")
_LEGACY_TEMP_RE = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # .<stem>.<hex>.tmp, before host and pid were named


def is_temporary(name: str) -> bool:
    """Whether the file name ``name`` is a writer's temporary file (renamed into place once written)."""
    return bool(_TEMP_RE.match(name) or _LEGACY_TEMP_RE.match(name))


_PARALLEL_FROM = 32  # unchecked files from which footers are read on threads

# path -> (mtime_ns, size, reason it is skipped or None)
_verdicts: dict[str, tuple[int, int, str | None]] = {}


# --- which files a reader trusts -------------------------------------------------------------------------------


def required_columns(table: Table, version: int | None) -> list[str]:
    """The columns a file of ``table`` must hold to be read.

    ``version`` is the file's ``sweep.schema_version`` metadata. A file this tool wrote holds
    every non-nullable column its version had (``Column.since``). A file without the metadata
    (rewritten by another tool, or foreign) must at least hold what every version of the table
    had and every reader relies on: ``schema_version``, ``run_id``, ``created_at``, ``model``
    (those the table has). A file of a newer version is held to this version's columns. The
    partition columns are never required: they are the file's directory names (files of schema
    4 and later do not hold them; older ones do, with the same values).
    """
    if version is None:
        core = {"schema_version", "run_id", "created_at", "model"}
        found = [c.name for c in table.columns if not c.nullable and c.name in core]
    else:
        found = [c.name for c in table.columns if not c.nullable and c.since <= min(version, SCHEMA_VERSION)]
    return [name for name in found if name not in table.partition_by]


def partition_values(table: Table, path: Path) -> dict[str, str] | None:
    """The partition values of a file of ``table`` from its directories (``.../<key>=<value>/<file>``,
    one per partition column, in order); None when ``path`` is not laid out so."""
    n = len(table.partition_by)
    if not n:
        return {}
    dirs = Path(path).parts[-1 - n : -1]
    if len(dirs) != n:
        return None
    values = {}
    for key, part in zip(table.partition_by, dirs):
        name, sep, value = part.partition("=")
        if name != key or not sep or not value:
            return None
        values[key] = value
    return values


_SCHEMAS: dict[str, pl.Schema] = {}  # a footer's ARROW:schema text -> the schema polars reads from it


def _schema(path: Path, arrow_schema: str | None) -> pl.Schema:
    """The schema polars reads ``path`` with. Its types come from the footer's Arrow schema (the
    ``ARROW:schema`` entry pyarrow writes), and every file one writer wrote carries the same text: it
    is decoded once per distinct text, since decoding costs several times reading the footer's key-value
    metadata."""
    if arrow_schema is None:
        return pl.read_parquet_schema(path)
    schema = _SCHEMAS.get(arrow_schema)  # (one lookup: checks run on threads, and another may clear)
    if schema is None:
        schema = pl.read_parquet_schema(path)
        if len(_SCHEMAS) >= 64:
            _SCHEMAS.clear()
        _SCHEMAS[arrow_schema] = schema
    return schema


def problem(table: Table, path: Path) -> str | None:
    """Why ``path`` cannot be read as a file of ``table``; None when it can."""
    return _check(table, path)[0]


def _check(table: Table, path: Path) -> tuple[str | None, int | None]:
    """Why ``path`` cannot be read as a file of ``table`` (None when it can), and the schema version it was written
    under where that is newer than this release's (None otherwise)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read forever: never opened
            return "not a regular file (a FIFO, a directory or a device planted in the results)", None
    except OSError as exc:
        return f"cannot stat it ({exc.strerror or exc})", None
    if partition_values(table, path) is None:
        layout = "/".join(f"{k}=<value>" for k in table.partition_by)
        return f"not in the layout of table '{table.name}' ({table.name}/{layout}/<file>.parquet)", None
    try:
        meta = pl.read_parquet_metadata(path)
        schema = _schema(path, meta.get("ARROW:schema"))
    except Exception as exc:  # noqa: BLE001 - any failure to read the footer means the same: not usable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"not a readable Parquet file ({type(exc).__name__}: {first[:200]})", None
    owner = meta.get("sweep.table")
    if owner is not None and owner != table.name:
        return f"written for table '{owner}', not '{table.name}'", None
    version: int | None = None
    if owner is not None:
        try:
            version = int(meta.get("sweep.schema_version", ""))
        except ValueError:
            version = None
    missing = [c for c in required_columns(table, version) if c not in schema]
    if missing:
        return f"lacks required column(s) {', '.join(missing)} of table '{table.name}'", None
    for c in table.columns:
        if c.name in schema and schema[c.name] != c.dtype and schema[c.name] != pl.Null():
            return f"column {c.name} is {schema[c.name]}, table '{table.name}' declares {c.dtype}", None
    return None, (version if version is not None and version > SCHEMA_VERSION else None)


def usable(table: Table, paths: list[Path]) -> list[Path]:
    """``paths`` without the files a reader cannot trust, each of those named once in a warning.

    Footers not checked before (or changed since) are read on a few threads: on shared storage
    a footer read is mostly latency.
    """
    stats: dict[Path, tuple[int, int]] = {}
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:  # replaced or removed since it was listed
            continue
        stats[path] = (st.st_mtime_ns, st.st_size)
    unchecked = [p for p, key in stats.items() if _verdicts.get(str(p), (None, None))[:2] != key]
    if len(unchecked) >= _PARALLEL_FROM:
        chunks = [unchecked[i : i + _PARALLEL_FROM] for i in range(0, len(unchecked), _PARALLEL_FROM)]
        with ThreadPoolExecutor(max_workers=8) as pool:  # in chunks: a future per file costs more than its check
            checks = [r for chunk in pool.map(lambda c: [_check(table, p) for p in c], chunks) for r in chunk]
    else:
        checks = [_check(table, p) for p in unchecked]
    newer: dict[int, list[Path]] = {}
    for path, (reason, version) in zip(unchecked, checks):
        _verdicts[str(path)] = (*stats[path], reason)
        if reason is not None:
            log.warning("skipping %s: %s", path, reason)
        elif version is not None:
            newer.setdefault(version, []).append(path)
    _tell_newer(table, newer)
    return [p for p in stats if _verdicts[str(p)][2] is None]


def _tell_newer(table: Table, newer: dict[int, list[Path]]) -> None:
    """Files written under a newer schema version than this release's, checked now (a file is checked once while it
    is unchanged), are read as this version (its columns; a column whose meaning or unit changed under the newer
    version, which bumps it, reads as this version's): said in one warning per version, not silently."""
    for version, found in sorted(newer.items()):
        log.warning(
            "%d file(s) of table '%s' (e.g. %s) were written under schema version %d, newer than this release's "
            "%d: read as version %d (its columns only; see docs/schema.md); update sweep to read them as written",
            len(found),
            table.name,
            found[0],
            version,
            SCHEMA_VERSION,
            SCHEMA_VERSION,
        )


# --- temporary files -------------------------------------------------------------------------------------------


def _host_token() -> str:
    """This host's name and pid namespace: two writers with the same token see each other's pids."""
    name = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname() or "host")[:64]
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return name
    return f"{name}.{ns}"


def temp_path(path: Path) -> Path:
    """The hidden temporary name ``path`` is written under before its rename: ``.<stem>~<host>~<pid>~<hex>.tmp``."""
    return path.with_name(f".{path.stem}~{_host_token()}~{os.getpid()}~{uuid.uuid4().hex[:12]}.tmp")


_PID_MAX = 2**22  # Linux's PID_MAX_LIMIT: pids stay below it, so this one or a larger one names no process
_named: set[str] = set()  # temporary-looking names already logged as not a live writer's


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _odd_name(path: str, why: str) -> None:
    """Log once that ``path`` looks like a temporary file but names no writer of this host: left alone."""
    if path not in _named:
        _named.add(path)
        log.warning("leaving %s alone: %s (removed once it is older than %.0f s)", path, why, STALE_AFTER_S)


def stale_temps(directory: Path, *, now: float | None = None) -> list[Path]:
    """The orphaned temporary files in ``directory`` (see the module's docstring)."""
    now = time.time() if now is None else now
    host = _host_token()
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(".") or not entry.name.endswith(".tmp"):
            continue
        m = _TEMP_RE.match(entry.name)
        if m is None and not _LEGACY_TEMP_RE.match(entry.name):
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if age > STALE_AFTER_S:
            found.append(Path(entry.path))
        elif m is None or m["host"] != host:
            continue
        elif not 0 < int(m["pid"]) < _PID_MAX:  # planted: no writer has that pid
            _odd_name(entry.path, f"pid {m['pid'][:30]} is not a process id")
        elif int(m["pid"]) != os.getpid() and not _alive(int(m["pid"])):
            found.append(Path(entry.path))
    return found


def remove_stale_temps(directory: Path) -> list[Path]:
    """Remove the orphaned temporary files in ``directory``; the ones removed (another writer may race us).
    Never raises: whatever is found there, the write that called this goes on."""
    removed = []
    try:
        stale = stale_temps(directory)
    except Exception as exc:  # noqa: BLE001 - a file planted here must never stop a writer
        log.warning("cannot check %s for orphaned temporary files: %s", directory, exc)
        return removed
    for path in stale:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:  # someone else's file on shared storage: leave it, say so
            log.warning("cannot remove the orphaned temporary file %s: %s", path, exc)
            continue
        log.info("removed the orphaned temporary file %s", path)
        removed.append(path)
    return removed
