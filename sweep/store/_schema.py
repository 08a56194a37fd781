"""The results contract, declared once: every table, column, type, unit and meaning.

docs/schema.md is generated from this package (``sweep schema``) and a test keeps the
two equal. Add columns freely; renaming a column or changing its meaning bumps
``SCHEMA_VERSION`` (``_columns.py``).
"""

from __future__ import annotations

from sweep.store._columns import GATE_FIELDS, PROVENANCE, SCHEMA_VERSION, Column, Table
from sweep.store._analysis import KNEES, PARETO, TARGETS
from sweep.store._tables import PROFILE, SIMULATED
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
        "Every table lives in its own directory under `results.root`, one layout for all: "
        "`<root>/<table>/<column>=<value>/.../<file>.parquet` for the partitioned tables (hive-style) and "
        "`<root>/<table>/<table>.parquet` for the analysis tables (`pareto`, `knees`, `targets`), so "
        "`<root>/<table>` is always the path to hand a reader. The partition columns are **not stored in the "
        "files** (schema 4): their values are the directory names, and every reader takes them from there. Each "
        "file is written to a hidden temporary name and renamed into place, so a reader never sees a half-written "
        "file; files whose names start with `.` are never results. Every file carries key-value metadata "
        "`sweep.schema_version` and `sweep.table`, and each column's unit and meaning as Arrow field metadata "
        "(keys `unit` and `description`; `theta`, whose unit depends on the gate, also `unit_by_gate`: JSON "
        "`{gate: unit}`), e.g. `pyarrow.parquet.read_schema(f).field('theta').metadata`. The temporary name "
        "carries the writer's host and pid; the next writer of the directory removes one whose writer is gone "
        "(same host) or that is over an hour old. A file under a table's directory that cannot be read as that "
        "table's (not Parquet, another table's, lacking a required column, a column of another type, outside the "
        "partition layout) is named in a warning and skipped.",
        "",
        "Reading with other tools: each of these opens any table directory with its defaults and gives the same "
        "columns and values; only the partition columns' types differ (they come from the path):",
        "",
        "| reader | call | partition columns |",
        "|---|---|---|",
        '| polars | `pl.scan_parquet("results/trials").collect()` | String |',
        '| pandas | `pd.read_parquet("results/trials")` | category (of str) |',
        '| pyarrow | `pyarrow.dataset.dataset("results/trials", partitioning="hive").to_table()` | string |',
        "| DuckDB | `read_parquet('results/trials/**/*.parquet', hive_partitioning=true)` | VARCHAR |",
        "",
        "Type inference from the path is the readers' own: a partition value that looks like a number (a model "
        "named `123`) comes back as an integer from polars, pyarrow and DuckDB, and as a category of integers "
        "from pandas, unless told otherwise, naming every partition column of the table (`trials`: `model` and "
        "`gate`; one left out is refused by polars and dropped by pyarrow): "
        "`hive_schema={'model': pl.String, 'gate': pl.String}`, "
        "`partitioning=ds.partitioning(pa.schema([('model', pa.string()), ('gate', pa.string())]), "
        "flavor='hive')` (pandas takes the same as `partitioning=`), `hive_types={'model': 'VARCHAR', 'gate': "
        "'VARCHAR'}`; `sweep.store.scan` always types them as declared below. A polars read of a directory fails "
        "while a writer's temporary file is in it (polars does not skip hidden files by default): pass "
        "`hidden_file_prefix='.'`, or the glob `results/trials/**/*.parquet` with `hive_partitioning=True` (a "
        "glob alone reads no partition column).",
        "",
        "Compatibility: columns are only ever added under one version. Renaming a column or changing its "
        "meaning or unit bumps the version. Read with the schema of the newest version and "
        '`missing_columns="insert"` so older files load with nulls in newer columns (`sweep.store.scan` does). '
        "A non-nullable column added later bumps the version (the reader requires it only of files of that "
        "version or newer); a file without the metadata must hold at least the table's `schema_version`, `run_id`, "
        "`created_at` and `model` (unless a partition column). Files of schema 3 and older also hold the partition "
        "columns (as large_string) and load through `sweep.store.scan`; the analysis tables of schema 3 were single "
        "files `<root>/<table>.parquet`, removed by the next `sweep analyze`.",
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
                else f"a single file, `<root>/{table.name}/{table.name}.parquet`."
            ),
            "",
            "| column | type | unit | nullable | meaning |",
            "|---|---|---|---|---|",
        ]
        for c in table.columns:
            unit, meaning = (text.replace("|", "\\|") for text in (c.unit, c.meaning))
            lines.append(f"| `{c.name}` | {c.dtype} | {unit} | {'yes' if c.nullable else 'no'} | {meaning} |")
        lines.append("")
    return "\n".join(lines)
