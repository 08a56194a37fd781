"""Every stored trial and profile row under a results root, whatever schema version wrote it."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from sweep.store import scan

log = logging.getLogger("sweep.analysis")


def load_trials(root: str | Path) -> pl.LazyFrame:
    """All trial rows under ``root`` (all runs), in the current schema; older files' missing
    columns are null."""
    return scan("trials", root)


def load_profiles(root: str | Path) -> pl.LazyFrame:
    """All profile-trace rows under ``root`` (all runs), in the current schema."""
    return scan("profile", root)


def distinct_trials(trials: pl.DataFrame) -> pl.DataFrame:
    """One row per ``trial_id`` (each trial has one file; a copy of it under another name or partition
    would count it twice): the newest row of each id kept, the ids found more than once named in one
    warning. ``trials`` as it is when no id repeats."""
    repeated = trials.group_by("trial_id").len().filter(pl.col("len") > 1).sort("trial_id")
    if repeated.height == 0:
        return trials
    shown = ", ".join(f"{r['trial_id']} ({r['len']} rows)" for r in repeated.head(5).iter_rows(named=True))
    more = f" and {repeated.height - 5} more" if repeated.height > 5 else ""
    log.warning(
        "%d trial ids have more than one row (copies of a trial's file): each counted once, its newest row kept: %s%s",
        repeated.height,
        shown,
        more,
    )
    return trials.sort("created_at", nulls_last=False).unique(subset="trial_id", keep="last", maintain_order=True)
