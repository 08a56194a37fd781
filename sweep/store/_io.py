"""Atomic Parquet writes and schema-tolerant reads of the results tables."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import polars as pl

from sweep.errors import SweepError
from sweep.paths import check_name, inside
from sweep.store._guard import remove_stale_temps, temp_path, usable
from sweep.store._schema import SCHEMA_VERSION, TABLES, Table


def table_spec(name: str) -> Table:
    if name not in TABLES:
        raise SweepError(f"unknown results table '{name}'; tables: {', '.join(TABLES)}")
    return TABLES[name]


def write_table(
    name: str,
    data: Mapping[str, Any] | pl.DataFrame,
    *,
    root: str | Path,
    provenance: Mapping[str, Any],
    stem: str = "",
    exclusive: bool = False,
) -> Path:
    """Write one unit of work as ``<root>/<table>/<partitions>/<stem>.parquet``, atomically
    (a derived, single-file table as ``<root>/<table>.parquet``, replaced each time).

    ``data`` holds the table's own columns; ``provenance`` the values shared by every
    row. The columns must be exactly the declared ones: a missing or unknown column is
    a bug, caught here rather than by a downstream reader. The stem and the partition
    values become path components: each must be a safe name (``sweep.paths.check_name``),
    and the final path must resolve inside ``root`` (symlinks included), else ConfigError
    and nothing is written. ``exclusive``: never replace an existing file (FileExistsError).
    """
    table = table_spec(name)
    frame = data if isinstance(data, pl.DataFrame) else pl.DataFrame(dict(data))
    shared = {"schema_version": SCHEMA_VERSION, "created_at": datetime.now(timezone.utc), **provenance}
    frame = frame.with_columns(**{k: pl.lit(v) for k, v in shared.items() if k not in frame.columns})
    declared = [c.name for c in table.columns]
    missing = [c for c in declared if c not in frame.columns]
    extra = [c for c in frame.columns if c not in declared]
    if missing or extra:
        raise SweepError(f"table {name}: columns do not match the schema (missing {missing}, unknown {extra})")
    frame = frame.select([pl.col(c.name).cast(c.dtype) for c in table.columns])
    for c in table.columns:
        if not c.nullable and frame[c.name].null_count():
            raise SweepError(f"table {name}: column {c.name} has nulls but is declared not nullable")
    if table.single_file:
        path = Path(root) / f"{name}.parquet"
    else:
        directory = Path(root) / name
        for key in table.partition_by:
            values = frame[key].unique()
            if len(values) != 1:
                raise SweepError(f"table {name}: one file must hold one {key} (got {len(values)})")
            directory = directory / f"{key}={check_name(key, str(values[0]))}"
        path = directory / f"{check_name('stem', stem)}.parquet"
    inside(root, path)
    return atomic_write_parquet(frame, path, metadata=_metadata(name), exclusive=exclusive)


def _metadata(name: str) -> dict[str, str]:
    return {"sweep.schema_version": str(SCHEMA_VERSION), "sweep.table": name}


def atomic_write_parquet(frame: pl.DataFrame, path: Path, *, metadata: dict[str, str], exclusive: bool = False) -> Path:
    """Write to a hidden temporary file in the same directory, fsync, rename into place.

    The temporary name carries this host and pid (``_guard.temp_path``); orphans that killed
    writers left in the directory are removed first. ``exclusive``: the final file must not
    exist; it is linked into place (``os.link``, atomic, never replaces) and FileExistsError
    propagates when another writer got there first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    tmp = temp_path(path)
    try:
        frame.write_parquet(tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def files(name: str, root: str | Path, *, checked: bool = True) -> list[Path]:
    """Every finished file of a table (temporary and hidden files are never results).

    ``checked``: without the files that cannot be read as this table's (unreadable, another
    table's or tool's, lacking required columns, a column of another type), each named in
    one warning on the ``sweep.store`` logger (``_guard.usable``).
    """
    table = table_spec(name)
    if table.single_file:
        path = Path(root) / f"{name}.parquet"
        found = [path] if path.is_file() else []
    else:
        base = Path(root) / table.name
        if not base.is_dir():
            return []
        found = sorted(
            p for p in base.rglob("*.parquet") if not any(part.startswith(".") for part in p.relative_to(base).parts)
        )
    return usable(table, found) if checked else found


def scan(name: str, root: str | Path) -> pl.LazyFrame:
    """All rows of a table under ``root`` as a LazyFrame with the current schema.

    Files written under an older schema (fewer columns) load with nulls in the newer
    columns; columns this version does not know are ignored; a file that cannot be read
    as this table's is skipped with a warning (``files``).
    """
    table = table_spec(name)
    paths = files(name, root)
    if not paths:
        return pl.LazyFrame(schema=table.schema)
    return pl.scan_parquet(
        paths, schema=table.schema, missing_columns="insert", extra_columns="ignore", hive_partitioning=False
    )


def read(name: str, root: str | Path) -> pl.DataFrame:
    return scan(name, root).collect()
