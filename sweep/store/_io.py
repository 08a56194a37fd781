"""Atomic Parquet writes and schema-tolerant reads of the results tables."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import polars as pl

from sweep.errors import SweepError
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
) -> Path:
    """Write one unit of work as ``<root>/<table>/<partitions>/<stem>.parquet``, atomically
    (a derived, single-file table as ``<root>/<table>.parquet``, replaced each time).

    ``data`` holds the table's own columns; ``provenance`` the values shared by every
    row. The columns must be exactly the declared ones: a missing or unknown column is
    a bug, caught here rather than by a downstream reader.
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
        return atomic_write_parquet(frame, Path(root) / f"{name}.parquet", metadata=_metadata(name))
    directory = Path(root) / name
    for key in table.partition_by:
        values = frame[key].unique()
        if len(values) != 1:
            raise SweepError(f"table {name}: one file must hold one {key} (got {len(values)})")
        directory = directory / f"{key}={values[0]}"
    return atomic_write_parquet(frame, directory / f"{stem}.parquet", metadata=_metadata(name))


def _metadata(name: str) -> dict[str, str]:
    return {"sweep.schema_version": str(SCHEMA_VERSION), "sweep.table": name}


def atomic_write_parquet(frame: pl.DataFrame, path: Path, *, metadata: dict[str, str]) -> Path:
    """Write to a hidden temporary file in the same directory, fsync, rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        frame.write_parquet(tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
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


def files(name: str, root: str | Path) -> list[Path]:
    """Every finished file of a table (temporary and hidden files are never results)."""
    table = table_spec(name)
    if table.single_file:
        path = Path(root) / f"{name}.parquet"
        return [path] if path.is_file() else []
    base = Path(root) / table.name
    if not base.is_dir():
        return []
    return sorted(
        p for p in base.rglob("*.parquet") if not any(part.startswith(".") for part in p.relative_to(base).parts)
    )


def scan(name: str, root: str | Path) -> pl.LazyFrame:
    """All rows of a table under ``root`` as a LazyFrame with the current schema.

    Files written under an older schema (fewer columns) load with nulls in the newer
    columns; columns this version does not know are ignored.
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
