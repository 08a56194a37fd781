"""Screening, as `kind: screen` and `kind: bracket` do it: profile once, replay settings on the trace, run
closed-loop trials only where they decide something (the simulated Pareto front and the knee's neighbours).

The dense grid uses the search's own sub-spaces. Each point's config is composed once per combination of its
non-threshold values; the threshold is then set directly (validated like any config value), so thousands of points
cost milliseconds, not a Hydra compose each. The trace is taken in a worker with the trials' resources, on their
device; a resumed screen runs closed-loop what its earlier run selected (its `simulated` rows), without tracing.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any

import polars as pl

from sweep.analysis import FULL_DEPTH_ID
from sweep.config import Config, GateConfig, build, compose
from sweep.config.identity import trial_identity
from sweep.config.search import as_override, setting_override, spaces
from sweep.errors import ConfigError
from sweep.gates import GATE_COLUMNS, GATES
from sweep.orchestrate.settings import GridTrials, Plan, merge, trial_config
from sweep.orchestrate.searches.base import InWorker, Selection

log = logging.getLogger("sweep.orchestrate.searches.screen")
BASELINE = FULL_DEPTH_ID  # the reference point (1x, agreement 1) on every simulated front, as on every measured one
STANDARD_PROBES = ("hidden", "lens")  # probes a step pays alike at every setting of one gate (others: per setting)


def screen(plan: Plan, settings: GridTrials, worker: InWorker) -> Selection:
    """Profile the model once (in a worker with the trials' resources), then replay every setting on the trace
    (``screen_selection``); the settings to run closed-loop, and the simulated table."""
    t0 = time.perf_counter()
    traced = trace_for(plan, settings, worker)
    chosen, table = screen_selection(plan, settings, traced, worker.device, time.perf_counter() - t0)
    return Selection(chosen, table)


def trace_for(plan: Plan, settings: GridTrials, worker: InWorker) -> dict[str, Any]:
    """The profile trace of the sweep's model and prompts and its cost model, taken in a worker, with the probe of
    every gate of ``settings`` that probes measured in situ, as a bench measures its own: a probe timed alone
    misses what a step pays for it (the decision's device sync, the loop's break after each probed layer), and a
    replay charged that would predict a speedup the closed loop does not reach."""
    probes = {}  # one gate per probe a step pays: a standard probe costs the same at every threshold and layer
    for _, c in settings:
        probe = GATES.get(c.gate.name, key="gate").probe
        if probe == "none":
            continue
        standard = probe in STANDARD_PROBES and c.gate.lens != "tuned"
        probes.setdefault(c.gate.name if standard else c.gate, c.gate)
    probes = sorted(probes.values(), key=str)
    readouts = {g.readouts for g in probes} - {None}
    if len(readouts) > 1:
        raise ConfigError(
            f"gate.readouts: a screen replays one trace, traced with one readouts file; "
            f"this search names {len(readouts)}"
        )
    return worker.run(screen_trace, "screen trace", plan.base, plan.run_id, worker.device, probes)


def dense_settings(cfg: Config, base: list[str]) -> GridTrials:
    """Every point of the search's sub-spaces as (trial overrides, composed config)."""
    out = []
    for i, params in enumerate(spaces(cfg.search)):
        gate_name = next((p.values[0] for p in params if p.key == "gate" and p.kind == "fixed"), None)
        if gate_name is None:
            raise ConfigError(f"search.spaces[{i}]: a screen sub-space names its gate (gate: saturation, ...)")
        threshold = GATES.get(gate_name, key=f"search.spaces[{i}].gate").threshold
        key = f"gate.{threshold}" if threshold else None
        swept = next((p for p in params if p.key == key), None)
        others = [p for p in params if p.key != key]
        for combo in itertools.product(*(p.grid_values() for p in others)):
            fixed = [setting_override(p.key, v) for p, v in zip(others, combo)]
            corner = compose(merge(base, fixed))
            for value in swept.grid_values() if swept is not None else [None]:
                if swept is None:
                    out.append((fixed, corner))
                    continue
                overrides = [*fixed, as_override(key, value)]
                if threshold == "exit_layer":  # a layer index: composed, so min_depth drops as on the command line
                    out.append((overrides, compose(merge(base, overrides))))
                    continue
                gate = build(GateConfig, {**dataclasses.asdict(corner.gate), threshold: value}, "gate.")
                out.append((overrides, dataclasses.replace(corner, gate=gate)))
    return out


def select(table: pl.DataFrame, neighbours: int) -> pl.DataFrame:
    """Mark the settings to run closed-loop: the simulated front (speedup_model against
    agreement_tf, per model across gates) and the knee's ``neighbours`` on each side along
    its gate's threshold. Full-depth decoding (speedup 1, agreement 1) is always available,
    so it joins the front as a reference: settings predicted slower than it drop out."""
    from sweep.analysis import chord_knees, nondominated

    # settings that resolve to the same gate on this model (min_depth 0.1 and 0.2 of 4 layers...) are one
    table = table.with_columns(
        _first=pl.col("trial_id") == pl.col("trial_id").first().over("model", "gate", "min_layer", *GATE_COLUMNS)
    )
    sim = table.filter("_first").rename({"speedup_model": "_x", "agreement_tf": "_y"})
    baseline = sim.select("model").unique().with_columns(trial_id=pl.lit(BASELINE), _x=pl.lit(1.0), _y=pl.lit(1.0))
    front = nondominated(pl.concat([sim, baseline], how="diagonal_relaxed"), "_x", "_y", by=("model",))
    front = front.filter(pl.col("trial_id") != BASELINE)
    chosen = set(front["trial_id"].to_list())
    for knee in chord_knees(front, by=("model",), x="_x", y="_y").iter_rows(named=True):
        gate = GATES.get(knee["gate"], key="gate")
        if gate.threshold is None:
            continue
        line = sim.filter(
            (pl.col("model") == knee["model"])
            & (pl.col("gate") == knee["gate"])
            & (pl.col("min_layer") == knee["min_layer"])
            & pl.col("lens").eq_missing(knee["lens"])  # a tuned lens's thresholds are another line
        ).sort(gate.threshold)
        ids = line["trial_id"].to_list()
        at = ids.index(knee["trial_id"])
        chosen.update(ids[max(0, at - neighbours) : at + neighbours + 1])
    return table.with_columns(
        on_front=pl.col("trial_id").is_in(front["trial_id"].to_list()),
        selected=pl.col("trial_id").is_in(sorted(chosen)) & pl.col("_first"),
    ).drop("_first")


def screened_before(plan: Plan, settings, device: str) -> Selection | None:
    """A resumed screen: the settings its earlier run selected for closed-loop trials, with that run's simulated
    table (its rows in the `simulated` table: the end of the run compares and bounds as the first run's did), or
    None when it never got that far."""
    import polars as pl

    from sweep.store import scan

    table = scan("simulated", plan.root).filter(pl.col("sweep_name") == plan.name).collect()
    keep = set(table.filter(pl.col("selected"))["trial_id"].to_list())
    if not keep:
        return None
    return Selection([s for s in settings if trial_identity(s[1], device).id in keep], table)


def selection_written(root, name: str) -> bool:
    """Whether the screen sweep ``name`` wrote its selection under ``root`` (its `simulated` rows, some selected)."""
    from sweep.store import scan

    rows = scan("simulated", root).filter((pl.col("sweep_name") == name) & pl.col("selected"))
    return rows.select(pl.len()).collect().item() > 0


def screen_selection(plan: Plan, settings: GridTrials, traced: dict[str, Any], device: str, seconds: float):
    """`search=screen`, once the trace is in: write it, replay every setting on it, write the
    simulated rows, and return the settings to run closed-loop with the simulated table as written."""
    import polars as pl

    from sweep.bench.costs import CostModel
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
        "screen: traced %d prompts (%d decision positions) in %.1f s (%.1f s with the model's load and cost model); "
        "simulated %d settings in %.2f s; %d on the simulated front, %d run closed-loop (a grid of the same "
        "resolution: %d trials)",
        len(signals.prompt_ids),
        signals.positions,
        traced["trace_s"],
        seconds,
        len(settings),
        t2 - t1,
        int(table["on_front"].sum()),
        len(chosen),
        len(settings),
    )
    return chosen, rows  # as written: the trace's run id and the sweep's name with it


def screen_trace(base: list[str], run_id: str, device: str, probe_gates: list = ()) -> dict:
    """The profile trace of the sweep's model and prompts at the bench's length, and the cost
    model (with the probes of ``probe_gates``), on the device trials will use."""
    from sweep.bench.command import gate_readouts, load
    from sweep.bench.costs import cost_model
    from sweep.bench.session import process_session
    from sweep.config import GateConfig
    from sweep.gates import make_gate
    from sweep.trace.profile import traced_run

    cfg = trial_config(base, [], device)
    cfg = dataclasses.replace(cfg, gate=GateConfig())  # the model's own depth decides every layer index later
    readouts = {g.readouts for g in probe_gates} - {None}  # one file at most (the driver checked)
    if readouts:
        cfg = dataclasses.replace(cfg, profile=dataclasses.replace(cfg.profile, readouts=readouts.pop()))
    session = process_session()
    lm, _, prompts = load(cfg, session)
    t0 = time.perf_counter()
    trace, prov = traced_run(cfg, lm, prompts, run_id, cfg.bench.gen_tokens, session.readouts)
    traced_s = time.perf_counter() - t0
    gates = [make_gate(g, lm, gate_readouts(g, lm, prompts, session)) for g in probe_gates]
    return {
        "trace": trace,
        "provenance": prov,
        "trace_s": traced_s,  # the trace alone (the seconds the driver waited also load the model, price its steps)
        # the probes alone too (the cost table shows them); the replay charges every gate its probe in situ
        "costs": cost_model(
            lm, prompts[0].input_ids, gates=gates, kv_policies=[cfg.bench.kv_policy], probes_alone=True
        ).as_dict(),
    }
