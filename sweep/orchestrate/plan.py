"""Planning a sweep, without Ray: what to run, what is already done, and the names.

``plan_sweep`` validates the sweep, names it, fixes its base overrides, composes every
trial it can foresee (a bad value fails here, before Ray starts) and reads the rows that
already count as done. Once the driver knows the trials' resources it resolves their
device (``sweep.config.identity.trial_device``) and ``select_trials`` keeps the trials still to
run; a worker composes its trial with ``trial_config`` on that same device, so the ids
the planner skips by are the ids the workers' rows carry.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.orchestrate import claims
from sweep.config import Config, compose
from sweep.errors import ConfigError
from sweep.config.identity import trial_identity
from sweep.config.paths import check_tree, inside
from sweep.gates.skipset import Candidate
from sweep.config.search import WITH_THE_SET, as_override, check_search, grid, spaces

log = logging.getLogger("sweep.orchestrate.plan")

DONE_STATUSES = ("ok", "nondeterministic")  # rows that count as done; failed trials are redone
DRIVER_KEYS = ("resume", "sweep.name", "run_id", "results.root")  # overrides the driver sets for every trial

GridTrials = list[tuple[list[str], Config]]


@dataclass
class Plan:
    cfg: Config  # results.root resolved
    run_id: str
    root: Path
    storage: Path  # Tune's state and the Optuna study: <storage>/<name>
    name: str
    base: list[str]  # every trial's overrides before its own
    grid_trials: GridTrials | None  # None for Optuna (its trials are sampled while it runs)
    done: dict[str, dict] = field(default_factory=dict)  # rows that count as done, by trial id

    @property
    def path(self) -> Path:
        return self.storage / self.name


def plan_sweep(cfg: Config, overrides: list[str]) -> Plan:
    """Everything about a sweep that needs no cluster; bad input fails here."""
    from sweep.store.run_info import new_run_id

    check_search(cfg.search)  # (sweep.storage is checked a path when the config is validated)
    run_id = cfg.run_id or new_run_id()
    root = Path(cfg.results.root).expanduser().resolve()
    cfg = dataclasses.replace(cfg, results=dataclasses.replace(cfg.results, root=str(root)))
    storage = _storage(cfg, root)
    name = sweep_name(cfg, storage, run_id)
    # Tune and SQLite write where their paths lead: nothing under the sweep's directory may lead elsewhere
    if cfg.sweep.storage is not None:
        check_tree(storage, storage / name, key="sweep.storage")
    else:
        check_tree(root, storage / name, key="results.root")
    claims.check_dir(root)
    base = base_overrides(overrides, run_id, root)
    grid_trials = check_values(cfg, base)
    return Plan(cfg, run_id, root, storage, name, base, grid_trials, done_rows(cfg))


def _storage(cfg: Config, root: Path) -> Path:
    """Tune's storage resolved: ``sweep.storage``, else ``<results.root>/ray``, which must then resolve
    inside results.root (a link planted there would take Tune's files elsewhere)."""
    if cfg.sweep.storage is not None:
        return Path(cfg.sweep.storage).expanduser().resolve()
    return inside(root, root / "ray", key="results.root")


def base_overrides(overrides: list[str], run_id: str, root: Path) -> list[str]:
    """The command line's overrides, less the driver's own, plus this run's id and root."""
    kept = [o for o in overrides if o.split("=", 1)[0] not in DRIVER_KEYS]
    return [*kept, f"run_id={run_id}", f"results.root={root}"]


def merge(base: list[str], trial: list[str]) -> list[str]:
    """Trial overrides replace base overrides of the same key."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in trial}
    return [o for o in base if o.split("=", 1)[0].lstrip("+~") not in keys] + list(trial)


def trial_config(base: list[str], trial: list[str], device: str) -> Config:
    """A trial's config as a worker runs it: on ``device``, the one the driver resolved."""
    return dataclasses.replace(compose(merge(base, trial)), device=device)


def sweep_name(cfg: Config, storage: Path, run_id: str) -> str:
    if cfg.sweep.name is not None:
        if cfg.resume and not (storage / cfg.sweep.name).is_dir():
            raise ConfigError(f"sweep.name={cfg.sweep.name}: no sweep of that name under {storage} to resume")
        return cfg.sweep.name
    if not cfg.resume:
        return f"{cfg.search.name}-{run_id}"
    earlier = sorted(storage.glob(f"{cfg.search.name}-*"), key=lambda p: p.stat().st_mtime) if storage.is_dir() else []
    if not earlier:
        raise ConfigError(
            f"resume=true: no earlier sweep of search={cfg.search.name} under {storage}; pass sweep.name=NAME"
        )
    return earlier[-1].name


def done_rows(cfg: Config) -> dict[str, dict]:
    """Rows already under results.root that count as done, by trial id (unless sweep.rerun)."""
    import polars as pl

    from sweep.store import scan

    if cfg.sweep.rerun:
        return {}
    rows = scan("trials", cfg.results.root).filter(pl.col("status").is_in(DONE_STATUSES)).collect()
    return {r["trial_id"]: r for r in rows.sort("created_at").iter_rows(named=True)}


def row_ids(root: str | Path) -> set[str]:
    """The trial ids with a row under ``root``, whatever its status (a resumed Optuna sweep counts
    a study trial done only when its row exists: ``sweep.orchestrate.study.remaining_trials``)."""
    from sweep.store import scan

    return set(scan("trials", root).select("trial_id").collect()["trial_id"].to_list())


def check_values(cfg: Config, base: list[str]) -> GridTrials | None:
    """Compose every grid trial (returned with its config), or for Optuna both ends of every
    interval and every choice, so that a bad value fails before Ray starts. A screen's dense
    grid is composed the fast way (``sweep.orchestrate.screen.dense_settings``)."""
    if cfg.search.kind == "grid":
        return [(trial, compose(merge(base, trial))) for trial in grid(cfg.search)]
    if cfg.search.kind == "screen":
        from sweep.orchestrate.screen import dense_settings

        return dense_settings(cfg, base, merge)
    if cfg.search.kind == "skipset":  # its settings come from the screen; their shared part must compose
        for stop in cfg.search.draft_stops or [None]:
            for n in cfg.search.draft_lens or [None]:
                compose(merge(base, skipset_setting(cfg, Candidate("none", stop, n))))
        return None
    for params in spaces(cfg.search):
        fixed = [as_override(p.key, p.values[0]) for p in params if p.kind == "fixed"]
        for p in params:
            values = p.values if p.kind == "choice" else (p.low, p.high) if p.kind == "interval" else ()
            for value in values:
                compose(merge(base, [*fixed, as_override(p.key, value)]))
    return None


def skipset_setting(cfg: Config, candidate: Candidate) -> list[str]:
    """A skipset search's closed-loop setting for a candidate: its sub-space's fixed values, its skip set, and
    the bench values the study drew with the set (``WITH_THE_SET``: where ``search.draft_stops`` or
    ``search.draft_lens`` is given)."""
    params = spaces(cfg.search)[0]
    fixed = [as_override(p.key, p.values[0]) for p in params]
    return [*fixed, as_override("gate.skip", candidate.skip), *drawn_overrides(cfg, candidate)]


def drawn_overrides(cfg: Config, candidate: Candidate) -> list[str]:
    """The bench overrides a skipset study drew with the candidate's set (none unless the search lists them)."""
    return [
        as_override(key, getattr(candidate, key.removeprefix("bench.")))
        for key, listed in WITH_THE_SET.items()
        if getattr(cfg.search, listed) is not None
    ]


def select_trials(
    grid_trials: GridTrials | None, done: dict, device: str, root: str
) -> tuple[list[list[str]] | None, int]:
    """Grid trials still to run on ``device``: not already done, each trial id once."""
    if grid_trials is None:
        return None, 0
    todo, seen, skipped = [], set(), 0
    for trial, trial_cfg in grid_trials:
        tid = trial_identity(trial_cfg, device).id
        if tid in done:
            skipped += 1
        elif tid not in seen:
            seen.add(tid)
            todo.append(trial)
    if skipped:
        log.info("skipping %d settings whose rows exist under %s (sweep.rerun=true redoes them)", skipped, root)
    return todo, skipped


def screened_before(plan: Plan, settings, device: str):
    """A resumed screen: the settings its earlier run selected for closed-loop trials (from
    its rows in the `simulated` table), or None when it never got that far."""
    import polars as pl

    from sweep.store import scan

    chosen = (
        scan("simulated", plan.root)
        .filter((pl.col("sweep_name") == plan.name) & pl.col("selected"))
        .select("trial_id")
        .collect()["trial_id"]
    )
    if chosen.len() == 0:
        return None
    keep = set(chosen.to_list())
    return [s for s in settings if trial_identity(s[1], device).id in keep]


def done_settings(grid_trials: GridTrials | None, done: dict, device: str) -> list[dict]:
    """The rows, already done, of the grid's settings on ``device``: each once, in grid order (what a
    finished sweep run again shows); none for Optuna (its settings are sampled as it runs)."""
    rows, seen = [], set()
    for _, trial_cfg in grid_trials or []:
        tid = trial_identity(trial_cfg, device).id
        if tid in done and tid not in seen:
            seen.add(tid)
            rows.append(done[tid])
    return rows


def tune_settings(config: dict) -> list[list[str]]:
    """The settings (override lists) a Tune trial's config holds: one (``trial``) or a bundle
    timed against one shared baseline (``trials``, ``baseline_groups``)."""
    return config.get("trials") or [config["trial"]]


def baseline_groups(grid_trials: GridTrials, todo: list[list[str]], size: int) -> list[list[list[str]]]:
    """The trials in ``todo`` bundled for ``sweep.shared_baseline``: at most ``size`` per bundle,
    each bundle's settings alike in everything but the gate, bench.kv_policy, bench.mode and
    bench.draft_len (so one full-depth baseline per round serves them all:
    ``sweep.bench.protocol.run_trials``), in planned order."""
    cfgs = {tuple(trial): c for trial, c in grid_trials}
    groups: dict[str, list[list[str]]] = {}
    for trial in todo:
        cfg = cfgs[tuple(trial)]
        bench = dataclasses.replace(cfg.bench, kv_policy="full", mode="early_exit", draft_len=1)
        groups.setdefault(repr(dataclasses.replace(cfg, gate=None, bench=bench)), []).append(trial)
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]


def screen_selection(plan: Plan, settings: GridTrials, traced: dict[str, Any], device: str, seconds: float):
    """`search=screen`, once the trace is in: write it, replay every setting on it, write the
    simulated rows, and return the settings to run closed-loop with the simulated table."""
    import polars as pl

    from sweep.bench.costs import CostModel
    from sweep.orchestrate.screen import select
    from sweep.trace.simulate import signals_from_trace, simulate
    from sweep.store import write_table

    cfg, trace, prov = plan.cfg, traced["trace"], traced["provenance"]
    write_table("profile", trace, root=cfg.results.root, provenance=prov, stem=f"{plan.run_id}-screen")
    t1 = time.perf_counter()
    signals = signals_from_trace(trace)
    table = simulate([c.gate for _, c in settings], signals, CostModel(**traced["costs"]), cfg.bench.kv_policy)
    t2 = time.perf_counter()
    first = settings[0][1]
    table = table.with_columns(
        trial_id=pl.Series([trial_identity(c, device).id for _, c in settings]),
        min_depth=pl.Series([c.gate.min_depth for _, c in settings], dtype=pl.Float64),
        model=pl.lit(prov["model"]),
    )
    table = select(table, cfg.search.neighbours)
    rows = table.with_columns(
        source=pl.lit("simulated"),
        sweep_name=pl.lit(plan.name),
        trace_run_id=pl.lit(prov["run_id"]),
        kv_policy=pl.lit(cfg.bench.kv_policy),
        prompt_set=pl.lit(first.prompts.name),
        n_prompts=pl.lit(len(signals.prompt_ids)),
        gen_tokens=pl.lit(first.bench.gen_tokens),
        positions=pl.lit(signals.positions),
    )
    shared = {k: v for k, v in prov.items() if k != "model"}
    write_table("simulated", rows, root=cfg.results.root, provenance=shared, stem=plan.name)
    chosen = [s for s, keep in zip(settings, table["selected"].to_list()) if keep]
    log.info(
        "screen: traced %d prompts (%d decision positions) in %.1f s; simulated %d settings in %.2f s; "
        "%d on the simulated front, %d run closed-loop (a grid of the same resolution: %d trials)",
        len(signals.prompt_ids),
        signals.positions,
        seconds,
        len(settings),
        t2 - t1,
        int(table["on_front"].sum()),
        len(chosen),
        len(settings),
    )
    return chosen, table
