"""What every search and the planner share: a setting's overrides and composed config, the plan of a sweep, and
the rows already under its root."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from sweep.config import Config, compose

GridTrials = list[tuple[list[str], Config]]


@dataclass
class Plan:
    cfg: Config  # results.root resolved
    run_id: str
    root: Path
    storage: Path  # Tune's state and the Optuna study: <storage>/<name>
    name: str
    base: list[str]  # every trial's overrides before its own
    grid_trials: GridTrials | None  # what the search foresaw; None: sampled while Tune runs, or chosen in a worker
    done: dict[str, dict] = field(default_factory=dict)  # rows that count as done, by trial id

    @property
    def path(self) -> Path:
        return self.storage / self.name


def merge(base: list[str], trial: list[str]) -> list[str]:
    """Trial overrides replace base overrides of the same key."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in trial}
    return [o for o in base if o.split("=", 1)[0].lstrip("+~") not in keys] + list(trial)


def trial_config(base: list[str], trial: list[str], device: str) -> Config:
    """A trial's config as a worker runs it: on ``device``, the one the driver resolved."""
    return dataclasses.replace(compose(merge(base, trial)), device=device)


def row_ids(root: str | Path) -> set[str]:
    """The trial ids with a row under ``root``, whatever its status (a resumed Optuna sweep counts
    a study trial done only when its row exists: ``sweep.orchestrate.searches.study.remaining_trials``)."""
    from sweep.store import scan

    return set(scan("trials", root).select("trial_id").collect()["trial_id"].to_list())


def sweep_rows(root: str | Path, name: str) -> set[str]:
    """The trial ids of the rows sweep ``name`` wrote under ``root`` (``sweep_name``)."""
    import polars as pl

    from sweep.store import scan

    rows = scan("trials", root).filter(pl.col("sweep_name") == name).select("trial_id").collect()
    return set(rows["trial_id"].to_list())
