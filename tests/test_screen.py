"""`search=screen` on a real embedded Ray: profile once, simulate a dense grid, run only
the simulated front (and the knee's neighbours) closed-loop, rows for both."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import sweep
from sweep.store import read


def test_screen_runs_a_quarter_of_the_grid_or_less(ray_session, tmp_path):
    outcome = sweep(tmp_path, "search=screen", "bench.gen_tokens=6")
    sim = read("simulated", tmp_path)
    assert sim.height == outcome.simulated.height > 100  # the dense grid, every setting simulated
    from sweep.gates import GATES

    assert set(sim["source"]) == {"simulated"} and set(sim["gate"]) == set(GATES.names()) - {
        "full",
        "skip",
        "classifier",
    }
    selected = sim.filter(pl.col("selected"))
    assert 0 < selected.height <= sim.height / 4
    trials = read("trials", tmp_path)
    assert set(trials["trial_id"]) == set(selected["trial_id"])  # exactly the selected settings ran closed-loop
    assert set(trials["source"]) == {"measured"}
    assert sim.filter(pl.col("on_front"))["trial_id"].is_in(trials["trial_id"].to_list()).all()
    profile = read("profile", tmp_path)
    assert (
        profile["run_id"].n_unique() == 1
        and sim["trace_run_id"].unique().to_list() == profile["run_id"].unique().to_list()
    )
    # the screen ran no full-depth trial, yet full depth is on every front it does not lose to, and a
    # candidate at every target: a front's other points all beat it, and no target is left without a pick
    assert trials.filter(pl.col("status") == "ok")["round_aa_ms"].null_count() == 0  # an A/A in every trial
    from sweep.cli.commands import main

    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    pareto, targets = read("pareto", tmp_path), read("targets", tmp_path)
    for _, front in pareto.partition_by("front", "front_gate", as_dict=True).items():
        others = front.filter(pl.col("trial_id") != "full-depth")
        assert (others["speedup"] > 1.0).all()  # full depth dominates every setting at 1x or slower
        beats = others.filter(pl.col("agreement") >= 1.0).height > 0
        assert ("full-depth" in front["trial_id"].to_list()) != beats
    assert targets["trial_id"].null_count() == 0 and (targets["speedup"] >= 1.0).all()
    at = targets.filter(pl.col("trial_id") == "full-depth")
    assert (at["gate"] == "full").all() and (at["agreement"] == 1.0).all()


def test_screen_comparison_pairs_simulated_and_measured(ray_session, tmp_path):
    from sweep.analysis import comparison, gap_by_gate

    outcome = sweep(tmp_path, "search=screen", "bench.gen_tokens=6", "search.neighbours=0")
    comp = comparison(outcome.simulated, outcome.rows)
    assert comp.height == outcome.simulated["selected"].sum()
    simulated = {r["trial_id"]: r["agreement_tf"] for r in outcome.simulated.iter_rows(named=True)}
    measured = {r["trial_id"]: r["agreement"] for r in outcome.rows}
    for r in comp.iter_rows(named=True):  # simulated minus measured, looked up by trial id
        assert r["agreement_gap"] == simulated[r["trial_id"]] - measured[r["trial_id"]]
    gaps = gap_by_gate(comp)
    assert gaps["trials"].sum() == comp.height


def test_selection_keeps_the_front_above_full_depth():
    from sweep.orchestrate.searches.screening import select

    # f (eps 0.25) lies between the knee b (0.2) and c (0.3) on the threshold line but off the front
    table = pl.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d", "e", "f"],
            "model": ["m"] * 6,
            "gate": ["saturation"] * 6,
            "min_layer": [8] * 6,
            "exit_layer": [None] * 6,
            "eps": [0.1, 0.2, 0.3, 0.4, 0.05, 0.25],
            "theta": [None] * 6,
            "q": [None] * 6,
            "k": [None] * 6,
            "decay": [None] * 6,
            "skip": [None] * 6,
            "lens": [None] * 6,
            "speedup_model": [1.2, 1.5, 2.0, 0.9, 0.95, 1.4],
            "agreement_tf": [0.9, 0.6, 0.2, 1.0, 1.0, 0.5],
        },
        schema_overrides={
            "exit_layer": pl.Int64,
            "theta": pl.Float64,
            "q": pl.Float64,
            "k": pl.Int64,
            "decay": pl.Float64,
            "skip": pl.String,
            "lens": pl.String,
        },
    )
    out = select(table, neighbours=0)
    assert out.filter("on_front")["trial_id"].sort().to_list() == [
        "a",
        "b",
        "c",
    ]  # d, e are slower than full depth; f is dominated by b
    assert out.filter("selected")["trial_id"].sort().to_list() == ["a", "b", "c"]
    wider = select(table, neighbours=1)  # the knee (b) and its threshold neighbours a and f
    assert wider.filter("selected")["trial_id"].sort().to_list() == ["a", "b", "c", "f"]
    widest = select(table, neighbours=2)  # and e (0.05) and c (0.3) two steps away
    assert widest.filter("selected")["trial_id"].sort().to_list() == ["a", "b", "c", "e", "f"]


def test_knee_neighbours_stay_on_their_lens():
    """A tuned-lens gate's thresholds are a line of their own: the knee's neighbours are taken
    along it, never from the logit-lens settings of the same gate that sit between them."""
    from sweep.orchestrate.searches.screening import select

    theta = [1.0, 2.0, 3.0, 1.5, 2.5]
    table = pl.DataFrame(
        {
            "trial_id": ["t1", "t2", "t3", "l1", "l2"],
            "model": ["m"] * 5,
            "gate": ["margin"] * 5,
            "min_layer": [8] * 5,
            **{c: [None] * 5 for c in ("exit_layer", "eps", "q", "k", "decay", "skip")},
            "theta": theta,
            "lens": ["tuned"] * 3 + [None] * 2,
            "speedup_model": [2.0, 1.6, 1.1, 0.8, 0.7],
            "agreement_tf": [0.5, 0.9, 0.99, 0.3, 0.2],
        },
        schema_overrides={"exit_layer": pl.Int64, "eps": pl.Float64, "q": pl.Float64, "k": pl.Int64, "skip": pl.String},
    ).with_columns(pl.col("decay").cast(pl.Float64), pl.col("lens").cast(pl.String))
    out = select(table, neighbours=1)
    assert out.filter("on_front")["trial_id"].sort().to_list() == ["t1", "t2", "t3"]
    assert out.filter("selected")["trial_id"].sort().to_list() == ["t1", "t2", "t3"]  # l1, l2 never


def test_a_screen_charges_each_probe_what_a_step_pays_for_it(tmp_path):
    """The replay of a setting that never exits is full depth plus its probes: step / (step + probes x probe),
    the probe measured in situ, as a trial's own cost model measures it (a probe timed alone misses what a step
    pays for it, and the replay then predicts a speedup its closed-loop trial does not reach)."""
    from conftest import TINY_SWEEP, compose
    from sweep.bench.costs import CostModel
    from sweep.orchestrate.plan import plan_sweep
    from sweep.orchestrate.searches.base import InWorker
    from sweep.orchestrate.searches.screening import trace_for
    from sweep.trace.simulate import signals_from_trace, simulate

    space = "search.spaces=[{gate: saturation, gate.eps: 'choice(0.000001,0.9)', gate.min_depth: 0.25}]"
    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=screen", space]
    plan = plan_sweep(compose(*args), args)
    probed = []  # the gates whose probes the screen's worker measures in situ

    def in_process(fn, _label, *args):
        probed.extend(args[-1])
        return fn(*args)

    traced = trace_for(plan, plan.grid_trials, InWorker(in_process, "cpu"))
    assert [g.name for g in probed] == ["saturation"]  # once: a standard probe costs the same at every threshold
    costs = CostModel(**traced["costs"])
    in_situ = costs.extra_probe_ms["saturation/hidden"]
    never = next(c.gate for _, c in plan.grid_trials if c.gate.eps == 0.000001)
    row = simulate([never], signals_from_trace(traced["trace"]), costs, "propagate").row(0, named=True)
    probes = costs.num_layers - row["min_layer"]  # after layers min_layer .. L - 1
    assert row["exit_rate"] == 0.0
    assert row["speedup_model"] == pytest.approx(costs.step_ms / (costs.step_ms + probes * in_situ), rel=1e-9)


def test_the_screen_says_how_long_its_trace_took_apart_from_the_load(tmp_path, caplog):
    """`screen: traced 2 prompts ... in 150.1 s` counted the worker's model load and cost model (the trace itself:
    78 s); the line now gives the trace's own seconds, and the whole wait beside them."""
    import logging
    import time

    from conftest import TINY_SWEEP, compose
    from sweep.orchestrate.plan import plan_sweep
    from sweep.orchestrate.searches.base import InWorker
    from sweep.orchestrate.searches.screening import screen_selection, trace_for

    space = "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1,0.9)', gate.min_depth: 0.25}]"
    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=screen", space]
    plan = plan_sweep(compose(*args), args)
    t0 = time.perf_counter()
    traced = trace_for(plan, plan.grid_trials, InWorker(lambda fn, _label, *a: fn(*a), "cpu"))
    whole = time.perf_counter() - t0
    assert 0 < traced["trace_s"] < whole
    with caplog.at_level(logging.INFO, logger="sweep"):
        screen_selection(plan, plan.grid_trials, traced, "cpu", whole)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("screen: traced")]
    assert f"in {traced['trace_s']:.1f} s ({whole:.1f} s with the model's load and cost model)" in line
