"""The results contract, declared once: every table, column, type, unit and meaning.

docs/schema.md is generated from this package (``sweep schema``) and a test keeps the
two equal. Add columns freely; renaming a column or changing its meaning bumps
``SCHEMA_VERSION`` (``_columns.py``).
"""

from __future__ import annotations

from sweep.store._columns import GATE_FIELDS, PROVENANCE, SCHEMA_VERSION, Column, Table
from sweep.store._tables import KNEES, PARETO, PROFILE, SIMULATED, TARGETS
from sweep.store._trials import TRIALS

__all__ = ["GATE_FIELDS", "PROVENANCE", "SCHEMA_VERSION", "TABLES", "Column", "Table", "markdown"]

TABLES: dict[str, Table] = {t.name: t for t in (PROFILE, TRIALS, SIMULATED, PARETO, KNEES, TARGETS)}


def markdown() -> str:
    """docs/schema.md: the contract as a document."""
    lines = [
        "# Results schema",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Generated from `sweep/store/_schema.py` by `sweep schema`; "
        "a test keeps this file and the code equal.",
        "",
        "Every table lives under `results.root`, one directory per table, hive-partitioned "
        "(`<root>/<table>/<column>=<value>/<file>.parquet`); the partition columns are also stored in the "
        "files. Each file is written to a hidden temporary name and renamed into place, so a reader never "
        "sees a half-written file; files whose names start with `.` are never results. Every file carries "
        "key-value metadata `sweep.schema_version` and `sweep.table`. The temporary name carries the writer's "
        "host and pid; the next writer of the directory removes one whose writer is gone (same host) or that is "
        "over an hour old. A file under a table's directory that cannot be read as that table's (not Parquet, "
        "another table's, lacking a required column, a column of another type) is named in a warning and skipped.",
        "",
        "Compatibility: columns are only ever added under one version. Renaming a column or changing its "
        "meaning or unit bumps the version. Read with the schema of the newest version and "
        '`missing_columns="insert"` so older files load with nulls in newer columns (`sweep.store.scan` does). '
        "A non-nullable column added later bumps the version (the reader requires it only of files of that "
        "version or newer); a file without the metadata must hold at least the table's `schema_version`, `run_id`, "
        "`created_at`, `model` and partition columns.",
        "",
    ]
    for table in TABLES.values():
        lines += [
            f"## `{table.name}`",
            "",
            table.description,
            "",
            f"One file per {table.unit_of_work}; "
            + (
                f"partitioned by {', '.join(f'`{p}`' for p in table.partition_by)}."
                if table.partition_by
                else "a single file beside the data."
            ),
            "",
            "| column | type | unit | nullable | meaning |",
            "|---|---|---|---|---|",
        ]
        for c in table.columns:
            lines.append(f"| `{c.name}` | {c.dtype} | {c.unit} | {'yes' if c.nullable else 'no'} | {c.meaning} |")
        lines.append("")
    return "\n".join(lines)
