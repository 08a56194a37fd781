"""Every stored trial and profile row under a results root, whatever schema version wrote it."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sweep.store import scan


def load_trials(root: str | Path) -> pl.LazyFrame:
    """All trial rows under ``root`` (all runs), in the current schema; older files' missing
    columns are null."""
    return scan("trials", root)


def load_profiles(root: str | Path) -> pl.LazyFrame:
    """All profile-trace rows under ``root`` (all runs), in the current schema."""
    return scan("profile", root)
