"""`kind: bracket`: each gate's thresholds bracketed from the model's own signals.

A profile trace of the sweep's model and prompts (taken in a worker, as a screen takes it) holds every gate's
signal at every decision position and layer. For each line of the search (a sub-space's gate and its other values:
``gate: saturation, gate.min_depth: choice(0.25, 0.5)`` is two lines) the threshold's candidates are values spread
over the gate's own signal where it decides (each midway between two values the model shows, the rule's either
side of the signal) and a quantile's grid of (0, 1], every one replayed on the trace; thresholds that replay alike
count once, and ``search.n_trials`` of them are kept per line, at equal steps
of the replayed agreement from the gentlest setting that exits down to the lowest agreement any reaches, so they
are dense where agreement changes fastest (a cliff between eps 0.1 and 0.2 gets its points), not evenly in the
threshold. The kept settings are replayed again and run closed-loop where the simulated front is (the screen's
selection); a resume runs what its earlier run selected, from that run's trace, without tracing again.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import polars as pl

from sweep.config import build, compose
from sweep.config.search import as_override, setting_override, spaces
from sweep.config.search_kinds import BracketSettings
from sweep.gates import GATES, PARAMS, check_model
from sweep.orchestrate.searches.screening import screen_selection, screened_before, selection_written, trace_for
from sweep.orchestrate.searches.base import InWorker, Search, Selection, register
from sweep.orchestrate.settings import GridTrials, Plan, merge

CANDIDATES = 64  # thresholds replayed per line before n_trials of them are kept


@register
class Bracket(Search):
    settings = BracketSettings
    summary = (
        "search.n_trials thresholds per line from its gate's signal on a trace; the simulated front runs closed-loop"
    )

    def foresee(self, cfg, base) -> GridTrials:
        """Every line of the search composed (its threshold at the gate's default, which the trace replaces)."""
        return lines(cfg, base)

    def continues(self, root, path) -> bool:
        return selection_written(root, path.name)

    def select(self, plan: Plan, worker: InWorker) -> Selection:
        if plan.cfg.resume:  # the earlier run's trace gives the same thresholds: run what it selected
            trace = earlier_trace(plan)
            if trace is not None:
                earlier = screened_before(plan, bracketed(plan, trace), worker.device)
                if earlier is not None:
                    return earlier
        t0 = time.perf_counter()
        traced = trace_for(plan, plan.grid_trials, worker)
        settings = bracketed(plan, traced["trace"])
        chosen, table = screen_selection(plan, settings, traced, worker.device, time.perf_counter() - t0)
        return Selection(chosen, table)


def lines(cfg, base: list[str]) -> GridTrials:
    """Each sub-space's lines: its gate with each combination of its other values, composed."""
    out = []
    for params in spaces(cfg.search):
        for combo in itertools.product(*(p.grid_values() for p in params)):
            overrides = [setting_override(p.key, v) for p, v in zip(params, combo)]
            out.append((overrides, compose(merge(base, overrides))))
    return out


def bracketed(plan: Plan, trace: pl.DataFrame) -> GridTrials:
    """``search.n_trials`` settings per line, their thresholds chosen on ``trace`` by their replayed agreement and
    exits alone (module docstring): the same trace gives the same settings."""
    from sweep.trace.simulate import signals_from_trace, simulate

    signals = signals_from_trace(trace)
    out: GridTrials = []
    for overrides, corner in plan.grid_trials or []:
        spec = GATES.get(corner.gate.name, key="gate")
        values = candidates(spec, corner.gate, signals)
        settings = [_with(overrides, corner, spec.threshold, v, plan.base) for v in values]
        table = simulate([c.gate for _, c in settings], signals, None, plan.cfg.bench.kv_policy)
        out += [settings[i] for i in kept(table, plan.cfg.search.n_trials)]
    return out


def candidates(spec, gate, signals) -> list:
    """Threshold values to replay for ``gate`` on the trace: every layer for a layer index; otherwise values
    midway between neighbours of the gate's own signal where it decides (and their complements, for a rule on
    1 - signal) and ``CANDIDATES`` evenly spaced values of (0, 1] (a quantile's own scale), each inside the
    parameter's domain for this gate."""
    L, param = signals.num_layers, spec.threshold
    domain = spec.domain(param)
    if PARAMS[param].type is int:
        return [v for v in range(1, L) if domain.check(v)]
    min_layer = check_model(gate, L).min_layer
    traced = {"delta": signals.delta, "margin": signals.margin}.get(spec.signal)
    if traced is None:
        traced = signals.extra.get(spec.signal)
    values: list[float] = [i / CANDIDATES for i in range(1, CANDIDATES + 1)]  # a quantile's own scale: q
    if traced is not None:
        seen = traced[:, min_layer - 1 : L - 1].double().flatten().unique().sort().values
        if len(seen) > 1:
            import torch  # here, not at import: jobs/submit.py foresees a search without it

            at = torch.linspace(0, len(seen) - 2, min(CANDIDATES, len(seen) - 1)).round().long().unique()
            mids = ((seen[at] + seen[at + 1]) / 2).tolist()
            values += mids + [1.0 - m for m in mids]
    return sorted({round(v, 12) for v in values if domain.check(round(v, 12))})


def kept(table: pl.DataFrame, n: int) -> list[int]:
    """The indices of ``n`` settings of one line: from the gentlest setting that exits (the highest replayed
    agreement any reaches) to the harshest (the lowest), at equal steps of log disagreement, so most of them sit
    close to agreement 1 where a closed loop's agreement falls fastest (one early token that differs changes every
    token after it); each the nearest to its target (then the one exiting more), all distinct in what they do on
    the trace: thresholds that replay alike (every gate's rule is monotone in its threshold, so the same agreement,
    exit rate and mean exit layer are the same exits) are one setting to the replay, which cannot tell them apart,
    and only the middle one of them is a candidate (the farthest from the values the model shows)."""
    same = [c for c in ("agreement_tf", "exit_rate", "mean_exit_layer") if c in table.columns]
    rows = table.with_row_index("_i").filter(pl.col("exit_rate") > 0)
    alike: dict[tuple, list[int]] = {}
    for i, *outcome in rows.select("_i", *same).iter_rows():
        alike.setdefault(tuple(outcome), []).append(i)
    rows = rows.filter(pl.col("_i").is_in([group[len(group) // 2] for group in alike.values()]))
    if rows.height == 0:
        return []
    hi, lo = rows["agreement_tf"].max(), rows["agreement_tf"].min()
    # disagreement from hi's (at least one position in a thousand) to lo's, log-spaced
    d_hi, d_lo = max(1.0 - hi, 1e-3), max(1.0 - lo, 1e-3)
    chosen: list[int] = []
    for k in range(n):
        target = 1.0 - d_hi * (d_lo / d_hi) ** (k / max(n - 1, 1))
        order = rows.with_columns(_d=(pl.col("agreement_tf") - target).abs()).sort(
            "_d", "exit_rate", descending=[False, True]
        )
        for i in order["_i"].to_list():
            if i not in chosen:
                chosen.append(i)
                break
    return sorted(chosen)


def _with(overrides: list[str], corner, param: str, value, base: list[str]):
    """A line's setting at threshold ``value``: its overrides, and its config (composed for a layer index, so a
    default min_depth drops as on the command line; else the threshold set on the composed line)."""
    setting = [*overrides, as_override(f"gate.{param}", value)]
    if PARAMS[param].type is int:
        return setting, compose(merge(base, setting))
    gate = build(type(corner.gate), {**dataclasses.asdict(corner.gate), param: value}, "gate.")
    return setting, dataclasses.replace(corner, gate=gate)


def earlier_trace(plan: Plan) -> pl.DataFrame | None:
    """The trace this sweep's earlier run bracketed on (its `simulated` rows name the trace's run), or None."""
    from sweep.store import scan

    simulated = scan("simulated", plan.root).filter(pl.col("sweep_name") == plan.name).select("trace_run_id")
    runs = simulated.collect()["trace_run_id"].unique().to_list()
    if len(runs) != 1:
        return None
    trace = scan("profile", plan.root).filter(pl.col("run_id") == runs[0]).collect()
    return trace if trace.height else None
