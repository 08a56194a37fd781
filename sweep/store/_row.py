"""A trial's row as one typed value: every column of the trials table, part by part (``TRIAL_PARTS``), checked
when it is built, not when its Parquet file is written. It is what a sweep's worker reports (a structured value
across Ray, never JSON text), what the single writer stores and what `sweep bench` prints; it reads as a mapping of
column to value, in the table's order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from sweep.store._trials import TRIAL_PARTS

WRITTEN = ("schema_version", "created_at")  # what the store adds when it writes the row (``write_table``)
COLUMNS = tuple(column for part in TRIAL_PARTS.values() for column in part if column.name not in WRITTEN)
NAMES = frozenset(c.name for c in COLUMNS)


class TrialRow(Mapping):
    """Every column of a trial's row but the two its write adds (``WRITTEN``). Built from mappings that together
    give each column once (a part's columns, the trial's own, its provenance); a column given twice, missing or
    unknown, or null where the table does not allow it, is a TypeError naming it."""

    __slots__ = ("_values",)

    def __init__(self, *given: Mapping[str, Any]) -> None:
        values: dict[str, Any] = {}
        for columns in given:
            twice = values.keys() & columns.keys()
            if twice:
                raise TypeError(f"a trial row's column given twice: {', '.join(sorted(twice))}")
            values.update(columns)
        unknown, missing = sorted(values.keys() - NAMES), sorted(NAMES - values.keys())
        if unknown or missing:
            raise TypeError(f"a trial row's columns: unknown {unknown}, missing {missing}")
        null = [c.name for c in COLUMNS if not c.nullable and values[c.name] is None]
        if null:
            raise TypeError(f"a trial row's columns that may not be null are: {', '.join(null)}")
        self._values = {c.name: values[c.name] for c in COLUMNS}

    def __getitem__(self, column: str) -> Any:
        return self._values[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def part(self, name: str) -> dict[str, Any]:
        """One part's columns (``TRIAL_PARTS``)."""
        return {c.name: self._values[c.name] for c in TRIAL_PARTS[name] if c.name not in WRITTEN}

    def replace(self, **columns: Any) -> TrialRow:
        """This row with ``columns`` changed."""
        return TrialRow({**self._values, **columns})

    def __getstate__(self) -> dict[str, Any]:
        return self._values

    def __setstate__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __repr__(self) -> str:
        return f"TrialRow(trial_id={self._values['trial_id']!r}, status={self._values['status']!r})"
