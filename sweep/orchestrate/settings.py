"""What every search and the planner share: a setting's overrides and composed config, and the plan of a sweep."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.config import Config, compose, override_key

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


@dataclass(frozen=True)
class Pass:
    """One pass of Tune trials, as the driver hands it to the cluster: a grid (``values``: each Tune trial's setting,
    or with ``key`` ``trials`` its bundle of settings sharing a baseline), or a search that samples while Tune runs
    (``study``: what its searcher needs, ``Search.searcher``; ``samples`` Tune trials, whose settings already
    measured are reported again from ``done``, rows by trial id)."""

    key: str = "trial"
    values: list | None = None
    study: Any = None
    samples: int = 0
    done: dict[str, dict] = field(default_factory=dict)

    @property
    def settings(self) -> int:
        """How many settings the pass runs."""
        if self.values is None:
            return self.samples
        return sum(len(v) for v in self.values) if self.key == "trials" else len(self.values)


def merge(base: list[str], trial: list[str]) -> list[str]:
    """Trial overrides replace base overrides of the same key."""
    keys = {override_key(o) for o in trial}
    return [o for o in base if override_key(o) not in keys] + list(trial)


def trial_config(base: list[str], trial: list[str], device: str) -> Config:
    """A trial's config as a worker runs it: on ``device``, the one the driver resolved."""
    return dataclasses.replace(compose(merge(base, trial)), device=device)


def setting_id(base: list[str], trial: list[str], device: str) -> str | None:
    """The trial id of a setting (``trial``: its overrides over ``base``) as the driver composes it on ``device``;
    None when it does not compose."""
    from sweep.config.identity import trial_identity
    from sweep.errors import SweepError

    try:
        return trial_identity(trial_config(base, trial, device), device).id
    except SweepError:
        return None


def setting_ids(base: list[str], trial: list[str], device: str, shapes: dict) -> tuple[str, str] | None:
    """The trial id of the setting ``trial`` and the id of what it runs (``sweep.config.identity.resolved_id``: a
    ``gate.min_depth`` keyed by the layer it resolves to on its model, whose depth is read before any load,
    ``sweep.models.shape_before_load``, kept in ``shapes`` by model; the trial id where it cannot be read); None
    when it does not compose."""
    from sweep.config.identity import resolved_id, trial_identity
    from sweep.errors import SweepError
    from sweep.gates import resolve_min_layer
    from sweep.models import shape_before_load

    try:
        cfg = trial_config(base, trial, device)
        ident = trial_identity(cfg, device)
        if cfg.gate.min_depth is None:
            return ident.id, ident.id
        if (model := repr(cfg.model)) not in shapes:
            shapes[model] = shape_before_load(cfg.model)
        shape = shapes[model]
        return ident.id, resolved_id(ident.key, None if shape is None else resolve_min_layer(cfg.gate, shape.layers))
    except SweepError:
        return None


def row_setting_ids(row: dict) -> tuple[str, ...]:
    """A row's trial id and the id of the setting it measured, as ``setting_ids`` gives a proposal's: from its key and
    the layer its gate resolved to (``min_layer``); its trial id alone where its key does not read."""
    from sweep.config.identity import resolved_id

    ids = (row["trial_id"],) if row.get("trial_id") is not None else ()
    try:
        return (*ids, resolved_id(row["trial_key"], row.get("min_layer")))
    except (KeyError, TypeError, ValueError, AttributeError):
        return ids


def tune_settings(config: dict) -> list[list[str]]:
    """The settings (override lists) a Tune trial's config holds: one (``trial``) or a bundle
    timed against one shared baseline (``trials``, ``baseline_groups``)."""
    return config.get("trials") or [config["trial"]]
