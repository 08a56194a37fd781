"""Atomic Parquet writes and schema-tolerant reads of the results tables."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from sweep.errors import ConfigError, SweepError
from sweep.config.paths import check_name, inside
from sweep.store._atomic import atomic_write
from sweep.store._cache import CACHE_FROM, read_cached, tell_empty
from sweep.store._guard import is_temporary, partition_values, remove_stale_temps, usable
from sweep.store._schema import SCHEMA_VERSION, TABLES, Table

log = logging.getLogger("sweep.store")

_DICTIONARY_FROM = 16  # rows from which a file's columns are dictionary-encoded
KEPT = "kept"  # <root>/<table>/kept/<partitions>/<stem>.parquet: rows whose own path could not be written


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
    under: str = "",
) -> Path:
    """Write one unit of work as ``<root>/<table>/<partitions>/<stem>.parquet``, atomically
    (a derived, single-file table as ``<root>/<table>/<table>.parquet``, replaced each time; the
    file an earlier version left at ``<root>/<table>.parquet`` is removed then).

    ``data`` holds the table's own columns; ``provenance`` the values shared by every
    row. The columns must be exactly the declared ones: a missing or unknown column is
    a bug, caught here rather than by a downstream reader. The partition columns are
    checked, then left out of the file: their values are its directory names (so pandas,
    pyarrow, DuckDB and polars each read them from the path, with no type to reconcile).
    The stem and the partition values become path components: each must be a safe name
    (``sweep.config.paths.check_name``), and the final path must resolve inside ``root`` (symlinks
    included), else ConfigError and nothing is written. ``exclusive``: never replace an
    existing file (FileExistsError). ``under``: a directory between the table's and its partitions' (``KEPT``).
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
    values = {}
    for key in table.partition_by:
        unique = frame[key].unique()
        if len(unique) != 1:
            raise SweepError(f"table {name}: one file must hold one {key} (got {len(unique)})")
        values[key] = unique[0]
    path = table_path(name, root, values, stem, under)
    written = atomic_write_parquet(
        frame.drop(table.partition_by),
        path,
        metadata=_metadata(name),
        exclusive=exclusive,
        field_metadata=field_metadata(name),
    )
    if table.single_file:
        _remove_legacy(Path(root) / f"{name}.parquet")
    return written


def table_path(name: str, root: str | Path, values: Mapping[str, Any], stem: str = "", under: str = "") -> Path:
    """Where table ``name`` keeps the file of one unit of work: ``<root>/<table>/<key>=<value>/.../<stem>.parquet``
    for the partition values ``values`` (``<root>/<table>/<table>.parquet`` for a single-file table;
    ``<root>/<table>/<under>/<key>=<value>/...`` with ``under``). Each value and the stem must be a safe name, and
    the path must resolve inside ``root``."""
    path = _layout(name, root, values, stem, under)
    inside(root, path)
    return path


def _layout(name: str, root: str | Path, values: Mapping[str, Any], stem: str = "", under: str = "") -> Path:
    """``table_path`` as laid out, before the check that it resolves inside ``root``."""
    table = table_spec(name)
    directory = Path(root) / name / under if under else Path(root) / name
    if table.single_file:
        return directory / f"{name}.parquet"
    for key in table.partition_by:
        directory = directory / f"{key}={check_name(key, str(values[key]))}"
    return directory / f"{check_name('stem', stem)}.parquet"


def write_or_keep(
    name: str, data: Mapping[str, Any], *, root: str | Path, stem: str, exclusive: bool = False
) -> tuple[Path, OSError | None]:
    """A row that work computed, written so that it lands: ``write_table`` to its own path; where that fails
    (a file planted in place of a partition directory after the work began, a directory made read-only), the
    same row under ``<root>/<table>/kept/<partitions>/<stem>.parquet``, where ``files``, ``scan`` and so
    ``sweep analyze`` and a resume's plan find it. Returns (the path written, the error of its own path: None when
    it landed there). A kept twin of a row written in place is removed. FileExistsError on the row's own file
    (``exclusive``: a row another writer put there first) propagates, as does the first error when the kept path
    fails too (a full disk, a link planted there). An error that names no file (pyarrow's) names the row's own
    path. The kept path is only looked at once it is needed: what is planted there never stops a row whose own
    path is free."""
    table = table_spec(name)
    values = {key: data[key][0] for key in table.partition_by}
    own = table_path(name, root, values, stem)
    try:
        path = write_table(name, data, root=root, provenance={}, stem=stem, exclusive=exclusive)
    except FileExistsError as exc:
        if os.path.lexists(own):
            raise  # the row's own file is there: another writer's row
        failure = exc
    except OSError as exc:
        failure = exc
    else:
        _remove_kept_twin(name, root, values, stem, path)
        return path, None
    _named(failure, own)  # the row's own path, not the writer's scratch
    try:
        return write_table(name, data, root=root, provenance={}, stem=stem, under=KEPT), failure
    except (OSError, ConfigError) as exc:
        log.warning("cannot keep the row of %s at %s either: %s", stem, Path(root) / name / KEPT, exc)
        raise failure from None


def _named(failure: OSError, path: str | Path) -> OSError:
    """``failure`` naming ``path`` where it names no file or a writer's temporary one (``_guard.is_temporary``)."""
    if failure.filename is None or is_temporary(os.path.basename(str(failure.filename))):
        failure.filename = str(path)
    return failure


def _remove_kept_twin(name: str, root: str | Path, values: Mapping[str, Any], stem: str, written: Path) -> None:
    """Remove the kept twin of a row just written in place (``write_or_keep``); a kept path that cannot be used
    (a link planted there) is left alone, said once."""
    try:
        kept = table_path(name, root, values, stem, KEPT)
        if os.path.lexists(kept):
            kept.unlink()
    except (OSError, ConfigError) as exc:
        log.warning("cannot remove the kept twin of %s: %s", written, exc)


def unwritten_line(row: Mapping[str, Any], failure: OSError, where: str | Path) -> str:
    """The one line a row that could not be written anywhere says: its trial, its figures (they are lost with it) and
    where and why its write failed (``where`` when the failure names no path)."""
    from sweep.errors import os_error

    figures = ", ".join(f"{k} {row.get(k)}" for k in ("status", "agreement", "speedup_wall"))
    where = _named(failure, where).filename
    return f"cannot write the row of trial {row['trial_id']} ({figures}) to {os_error(failure, where)}"


def kept_line(trial_id: str, failure: OSError, kept: Path) -> str:
    """The one line a row ``write_or_keep`` kept says: where its own path failed, why, and where it is."""
    from sweep.errors import os_error

    return (
        f"cannot write the row of trial {trial_id} to {os_error(failure, failure.filename)}; kept it at {kept}, "
        "where sweep analyze and a resume read it"
    )


def check_row_path(
    name: str, root: str | Path, values: Mapping[str, Any], stem: str, key: str = "results.root"
) -> Path:
    """Before any work: the path a row of table ``name`` will be written to (``table_path``) and the path it is kept
    at should its own fail (``KEPT``, ``write_or_keep``), each refused in one line naming the path where something
    is in its way: a directory of its partitions that is not a directory (a file or a symbolic link planted where
    ``gate=...`` or ``kept`` belongs), or the row's file that is not a regular file (a FIFO, a directory). The
    row's own path, as it will be written."""
    path = _free_path(name, root, values, stem, "", key)
    _free_path(name, root, values, stem, KEPT, key)
    return path


def _free_path(name: str, root: str | Path, values: Mapping[str, Any], stem: str, under: str, key: str) -> Path:
    import stat

    where = f"{'kept ' if under else ''}{name} rows of {', '.join(f'{k}={v}' for k, v in values.items())}"
    path, base = _layout(name, root, values, stem, under), Path(root)
    for parent in reversed(path.relative_to(base).parents):
        at = base / parent
        if at == base:
            continue  # the root itself: read once (sweep.config.paths.read_path), a link to a directory is the user's
        try:
            mode = os.lstat(at).st_mode
        except FileNotFoundError:
            break  # nothing further down exists yet: the writer makes it
        except OSError as exc:
            raise ConfigError(f"{key}: cannot check {at} ({exc.strerror or exc})") from None
        if not stat.S_ISDIR(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
            raise ConfigError(
                f"{key}: {at} is {what} (planted where the {where} are written); remove it or use another {key}"
            )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{key}: {path} is not a regular file (planted where a row is written); remove it")
    return table_path(name, root, values, stem, under)  # (inside the root: every directory above was checked)


def _metadata(name: str) -> dict[str, str]:
    return {"sweep.schema_version": str(SCHEMA_VERSION), "sweep.table": name}


@lru_cache(maxsize=None)
def field_metadata(name: str) -> dict[str, dict[str, str]]:
    """Per column of table ``name``: its Parquet field metadata (``Column.field_metadata``: unit, description)."""
    return {c.name: c.field_metadata() for c in table_spec(name).columns}


def _remove_legacy(path: Path) -> None:
    """The single file an analysis table was before schema 4 (``<root>/<table>.parquet``): gone once the
    table's directory holds the new file, so a glob over the root never mixes the two layouts."""
    try:
        if path.is_file() or path.is_symlink():
            path.unlink()
            log.info("removed %s (the table now lives in %s)", path, path.with_suffix(""))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove the old single-file table %s: %s", path, exc)


def atomic_write_parquet(
    frame: pl.DataFrame,
    path: Path,
    *,
    metadata: dict[str, str],
    exclusive: bool = False,
    field_metadata: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    """Write to a hidden temporary file in the same directory, fsync, rename into place.

    Written by pyarrow (zstd; dictionary-encoded above ``_DICTIONARY_FROM`` rows), with ``metadata`` as the
    file's key-value metadata and
    ``field_metadata`` (column name -> {key: value}) as its columns' Arrow field metadata.
    The temporary name carries this host and pid (``_guard.temp_path``); orphans that killed
    writers left in the directory are removed first. ``exclusive``: the final file must not
    exist; it is linked into place (``os.link``, atomic, never replaces) and FileExistsError
    propagates when another writer got there first.
    """
    table = _arrow(frame, metadata, field_metadata or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    # dictionary encoding pays only where values repeat: a one-row trial file writes faster without it
    return atomic_write(
        path,
        lambda tmp: pq.write_table(table, tmp, compression="zstd", use_dictionary=table.num_rows > _DICTIONARY_FROM),
        exclusive=exclusive,
    )


def _arrow(frame: pl.DataFrame, metadata: Mapping[str, str], fields: Mapping[str, Mapping[str, str]]) -> pa.Table:
    """``frame`` as an Arrow table carrying ``metadata`` and each column's field metadata (no copy)."""
    table = frame.to_arrow()
    schema = pa.schema(
        [f.with_metadata(dict(fields[f.name])) if f.name in fields else f for f in table.schema],
        metadata=dict(metadata),
    )
    return pa.Table.from_arrays(table.columns, schema=schema)


def files(name: str, root: str | Path, *, checked: bool = True) -> list[Path]:
    """Every finished file of a table (temporary and hidden files are never results).

    ``checked``: without the files that cannot be read as this table's (unreadable, another
    table's or tool's, lacking required columns, a column of another type), each named in
    one warning on the ``sweep.store`` logger (``_guard.usable``).
    """
    table = table_spec(name)
    base = Path(root) / table.name
    if not base.is_dir():
        return []
    found, links = [], []
    for directory, subdirs, names in os.walk(base):  # (not into hidden directories, nor through links)
        for d in [d for d in subdirs if d.startswith(".") or os.path.islink(os.path.join(directory, d))]:
            subdirs.remove(d)
            if not d.startswith("."):
                links.append(os.path.join(directory, d))
        # (a directory named *.parquet is found too, as a glob finds it: the check then says it is no file)
        for f in (*subdirs, *names):
            if f.endswith(".parquet") and not f.startswith("."):
                path = Path(directory, f)
                (links if path.is_symlink() else found).append(path)
    if links:  # never read (a link could take the reader anywhere): said, not passed over in silence
        shown = ", ".join(map(str, links[:3])) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
        log.warning("%d symbolic link(s) under %s are not read: %s", len(links), base, shown)
    return usable(table, sorted(found)) if checked else sorted(found)


def scan(name: str, root: str | Path, *, cache_from: int = CACHE_FROM) -> pl.LazyFrame:
    """All rows of a table under ``root`` as a LazyFrame with the current schema.

    The partition columns come from each file's directory names, typed as the schema
    declares (a model named ``123`` stays the string "123"); files of schema 3 and older,
    which also hold them, read the same. Files written under an older schema (fewer
    columns) load with nulls in the newer columns; columns this version does not know are
    ignored; a file that cannot be read as this table's is skipped with a warning (``files``).
    A table of many small files (``Table.cached``: trials) is read through the reader's cache from
    ``cache_from`` files on (``_cache``: only new and changed files are read again; the rows are
    then already in memory).
    """
    table = table_spec(name)
    found = files(name, root, checked=False)
    if not table.cached or len(found) < cache_from:
        return _scan(table, usable(table, found))
    return read_cached(table, root, found, lambda paths, column: _scan(table, paths, column)).lazy()


def tell_empty_files(name: str, root: str | Path, rows: int) -> None:
    """Where ``rows`` rows were read from table ``name`` under ``root`` below the reader's cache (fewer than
    ``CACHE_FROM`` files: the cached reader names its own), the files that hold no row, named in one warning
    (``tell_empty``). A file's rows are counted only where the files outnumber the rows."""
    if rows >= CACHE_FROM:
        return
    found = files(name, root, checked=False)
    if not rows < len(found) < CACHE_FROM:
        return
    empty = [p for p in usable(table_spec(name), found) if pl.scan_parquet(p).select(pl.len()).collect().item() == 0]
    tell_empty(table_spec(name), empty)


def read_file(name: str, path: str | Path) -> pl.DataFrame:
    """One file of table ``name`` (its rows, the partition columns from its path), in the current schema."""
    table = table_spec(name)
    if partition_values(table, Path(path)) is None:
        raise SweepError(f"{path}: not in the layout of table '{name}'")
    return _scan(table, [Path(path)]).collect()


def _scan(table: Table, paths: list[Path], path_column: str | None = None) -> pl.LazyFrame:
    """The rows of checked files ``paths``; ``path_column``: also each row's file path, in that column."""
    if not paths:
        return pl.LazyFrame(schema=table.schema)
    groups: dict[tuple[tuple[str, str], ...], list[Path]] = {}
    for path in paths:
        groups.setdefault(tuple(partition_values(table, path).items()), []).append(path)
    frames = [
        pl.scan_parquet(
            group,
            schema=table.schema,
            missing_columns="insert",
            extra_columns="ignore",
            hive_partitioning=False,
            include_file_paths=path_column,
        ).with_columns(**{key: pl.lit(value, dtype=table.schema[key]) for key, value in values})
        for values, group in groups.items()
    ]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def read(name: str, root: str | Path) -> pl.DataFrame:
    return scan(name, root).collect()
