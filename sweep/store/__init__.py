"""Results store: the declared Parquet schema, atomic writes, tolerant readers."""

from sweep.store._atomic import atomic_write
from sweep.store._guard import STALE_AFTER_S
from sweep.store._io import (
    KEPT,
    atomic_write_parquet,
    check_row_path,
    field_metadata,
    kept_line,
    unwritten_line,
    files,
    read,
    read_file,
    scan,
    table_path,
    table_spec,
    tell_empty_files,
    write_or_keep,
    write_table,
)
from sweep.store._schema import PROVENANCE, SCHEMA_VERSION, TABLES, Column, Table, markdown
from sweep.store._row import TrialRow
from sweep.store._task_columns import TASK_COLUMNS
from sweep.store._identity import broken_identity, trusted_rows
from sweep.store._trials import TRIAL_PARTS

__all__ = [
    "KEPT",
    "atomic_write",
    "STALE_AFTER_S",
    "PROVENANCE",
    "SCHEMA_VERSION",
    "TASK_COLUMNS",
    "TRIAL_PARTS",
    "TrialRow",
    "TABLES",
    "Column",
    "Table",
    "atomic_write_parquet",
    "broken_identity",
    "trusted_rows",
    "check_row_path",
    "field_metadata",
    "kept_line",
    "unwritten_line",
    "files",
    "tell_empty_files",
    "markdown",
    "read",
    "read_file",
    "scan",
    "table_path",
    "table_spec",
    "write_or_keep",
    "write_table",
]
