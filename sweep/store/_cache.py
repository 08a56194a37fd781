"""A reader's cache of one table's rows, for roots that hold thousands of one-row files.

Reading a trials table of 10,000 files costs a footer check and a read per file, on every
`sweep analyze` and every sweep's start (benchmarks/RESULTS.md: `benchmarks/analyze_10k.py`).
From ``CACHE_FROM`` files on,
``sweep.store.scan`` keeps the rows it read in one Parquet file per (root, table) under the
user's cache directory (``$SWEEP_CACHE_DIR/tables/``, else ``~/.cache/sweep/tables/``), each row
tagged with the identity of the file it came from: relative path, size, mtime (ns) and inode.
The next read lists the files and takes from the cache the rows of every file whose identity
is unchanged; new and changed files are checked and read as before, rows of removed files drop
out, and the cache is rewritten (atomically) only when something changed.

The results root is never written: its files stay the only truth, one per trial. The cache is
the reader's own and disposable (delete it at any time); one that cannot be read, or that was
written for another schema, is rebuilt; one that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable

import polars as pl

from sweep.store._atomic import atomic_write
from sweep.store._columns import SCHEMA_VERSION, Table
from sweep.store._guard import usable

log = logging.getLogger("sweep.store")

CACHE_FROM = 1000  # files of a table from which its rows are cached
FILE, KEYS = "_cache_file", ("_cache_file", "_cache_size", "_cache_mtime_ns", "_cache_ino")


def cache_dir() -> Path:
    """Where readers keep their table caches: ``$SWEEP_CACHE_DIR/tables`` or ~/.cache/sweep/tables."""
    base = os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "sweep"
    return Path(base).expanduser() / "tables"


def cache_file(table: Table, root: str | Path) -> Path:
    """The cache of ``table`` under ``root`` (one per resolved root)."""
    digest = hashlib.sha256(str(Path(root).expanduser().resolve()).encode()).hexdigest()[:24]
    return cache_dir() / digest / f"{table.name}.parquet"


def _fingerprint(table: Table) -> str:
    """What a cache must have been written for: this schema version and exactly these columns and types."""
    spec = ";".join(f"{name}:{dtype}" for name, dtype in table.schema.items())
    return f"{SCHEMA_VERSION}:{hashlib.sha256(spec.encode()).hexdigest()[:16]}"


def _identities(base: Path, paths: list[Path]) -> pl.DataFrame:
    """Each listed file's identity (the cache's key), without the files that vanished since listing."""
    rows, cut = [], len(str(base)) + 1  # (string slicing: pathlib's relative_to is slow over 10,000 files)
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        rows.append((str(path)[cut:], st.st_size, st.st_mtime_ns, st.st_ino))
    schema = {FILE: pl.String, "_cache_size": pl.Int64, "_cache_mtime_ns": pl.Int64, "_cache_ino": pl.UInt64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _load(path: Path, table: Table) -> pl.DataFrame | None:
    try:
        if pl.read_parquet_metadata(path).get("sweep.cache") != _fingerprint(table):
            return None
        return pl.read_parquet(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a cache that cannot be read is rebuilt, whatever the reason
        log.info("rebuilding the table cache %s (%s)", path, type(exc).__name__)
        return None


def _store(path: Path, rows: pl.DataFrame, table: Table) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"sweep.cache": _fingerprint(table)}
        atomic_write(path, lambda tmp: rows.write_parquet(tmp, compression="zstd", metadata=meta), durable=False)
    except (OSError, pl.exceptions.PolarsError) as exc:  # a read-only or full cache directory: read without one
        log.info("table cache not written (%s: %s)", type(exc).__name__, exc)


def tell_empty(table: Table, empty: list[Path]) -> None:
    """One warning naming the files of ``table`` that hold no row. sweep writes no empty file (a trial's file holds
    its row), so one was cut short or written by another tool: what it stood for is in no table, and a resume
    measures it again. An empty file holds nothing to cache, so it is read, and named, on every read."""
    if empty:
        shown = ", ".join(map(str, empty[:3])) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
        log.warning(
            "%d file(s) of table '%s' hold no row (sweep writes none: cut short, or written by another tool), so "
            "what they stood for is in no table; a resume (`sweep run` again) measures it: %s",
            len(empty),
            table.name,
            shown,
        )


def read_cached(
    table: Table, root: str | Path, found: list[Path], read: Callable[[list[Path], str], pl.LazyFrame]
) -> pl.DataFrame:
    """The rows of the files ``found`` (a table's listing, unchecked), the unchanged ones from the
    cache; ``read(paths, column)`` reads checked files with each row's path in ``column``."""
    base = Path(root) / table.name
    current = _identities(base, found)
    path = cache_file(table, root)
    cached = _load(path, table)
    kept = cached.join(current, on=list(KEYS), how="semi") if cached is not None else None
    known = set(kept[FILE].unique().to_list()) if kept is not None else set()
    fresh = [base / f for f in current[FILE].to_list() if f not in known]
    new = pl.DataFrame()
    checked = usable(table, fresh) if fresh else []
    if checked:
        read_rows = read(checked, FILE).with_columns(pl.col(FILE).str.slice(len(str(base)) + 1))
        new = read_rows.collect().join(current, on=FILE, how="inner")
        holding = set(new[FILE].to_list())
        tell_empty(table, [p for p in checked if str(p.relative_to(base)) not in holding])
    parts = [frame for frame in (kept, new) if frame is not None and frame.height]
    rows = pl.concat(parts, how="vertical") if parts else None
    changed = bool(checked) or cached is None or (kept is not None and kept.height != cached.height)
    if rows is not None and changed:
        _store(path, rows.sort(FILE, maintain_order=True), table)
    if rows is None:
        return pl.DataFrame(schema=table.schema)
    return rows.sort(FILE, maintain_order=True).drop(KEYS)
