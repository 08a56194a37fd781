"""The driver and the worker without Ray: `sweep run`'s own code (plan, the search's choice, passes of Tune trials,
the worker's claims and rows, the single writer, resume) on a cluster that runs each Tune trial in this process
(tests/helpers/inline.py). What Ray adds (its workers, Tune's callbacks and retries) is the ray tier's."""

from __future__ import annotations

import polars as pl

from conftest import TINY_SWEEP, compose
from helpers.inline import InlineCluster
from sweep.orchestrate.driver import drive
from sweep.orchestrate.plan import plan_sweep
from sweep.store import read

GRID = "search.spaces=[{gate: fixed, gate.exit_layer: 'choice(1,2,3)'},{gate: full}]"


def _drive(root, *overrides):
    args = [*TINY_SWEEP, f"results.root={root}", GRID, *overrides]
    cluster = InlineCluster()
    return drive(plan_sweep(compose(*args), args), cluster), cluster


def test_a_grid_runs_in_bundles_on_shared_baselines_and_a_second_run_measures_nothing(tmp_path):
    outcome, cluster = _drive(tmp_path, "sweep.shared_baseline=3")
    rows = read("trials", tmp_path)
    assert outcome.written == 4 and rows.height == 4 and set(rows["status"]) == {"ok"}
    assert [len(c["trials"]) for c in cluster.trials] == [3, 1]  # two Tune trials: a bundle of 3, then 1
    assert sorted(rows["baseline_shared"].to_list()) == [1, 3, 3, 3]
    assert rows["sweep_name"].unique().to_list() == [outcome.name]
    again, cluster = _drive(tmp_path, "sweep.shared_baseline=3")
    assert again.written == 0 and again.skipped == 4 and cluster.trials == [] and len(again.rows) == 4


def test_a_bundle_stops_its_hopeless_settings_and_a_resume_runs_none_of_them_again(tmp_path):
    stop = ["prompts.n=8", "bench.gen_tokens=8", "search.min_agreement=0.9", "search.rung_prompts=2"]
    outcome, cluster = _drive(tmp_path, "sweep.shared_baseline=4", *stop)
    rows = read("trials", tmp_path)
    stopped = rows.filter(pl.col("status") == "stopped")
    assert len(cluster.trials) == 1 and stopped.height >= 1  # one bundle: stopping keeps the settings together
    assert rows.filter(pl.col("gate") == "full")["status"].to_list() == ["ok"]
    assert rows.filter(pl.col("gate") == "full")["baseline_shared"].to_list() == [4 - stopped.height]
    resumed, cluster = _drive(tmp_path, "sweep.shared_baseline=4", *stop, "resume=true", f"sweep.name={outcome.name}")
    assert resumed.written == 0 and cluster.trials == []


def test_a_tune_trial_reports_each_setting_once_from_the_worker():
    """The worker's half alone: a setting whose row an earlier run left is reported again (cached) and not
    computed; a setting that does not compose is a report with its error and no row."""
    from sweep.orchestrate.report import row_of
    from sweep.orchestrate.worker import tune_trial

    base = [*TINY_SWEEP, "results.root=/nonexistent-root-never-written"]
    earlier = {"trial_id": "x", "status": "ok", "agreement": 1.0}
    reports = []
    cfg = compose(*base, "gate=full")
    from sweep.config.identity import trial_identity

    tid = trial_identity(cfg, "cpu").id
    context = {"run_id": "r", "sweep_name": "s", "device": "cpu", "done": {tid: {**earlier, "trial_id": tid}}}
    tune_trial({"trials": [["gate=full"]]}, base, context, reports.append)
    assert [(row_of(r)["trial_id"], r["cached"], r["reports_left"]) for r in reports] == [(tid, True, 0)]
    reports.clear()
    tune_trial({"trial": ["gate.eps=-1", "gate=saturation"]}, base, context, reports.append)
    assert len(reports) == 1 and row_of(reports[0]) is None and "gate.eps" in reports[0]["error"]


def test_a_resumed_sweep_redoes_its_failed_rows(tmp_path):
    """Failed trials are redone: a worker loads its trials without `sweep bench`'s check that refuses to replace a
    sweep's row (the driver's writer decides what replaces what)."""
    from sweep.orchestrate.plan import record_definition
    from sweep.orchestrate.writer import RowWriter

    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search.spaces=[{gate: full}]", "sweep.name=redo"]
    plan = plan_sweep(compose(*args), args)
    record_definition(plan)  # the first run started its work, and its worker died
    RowWriter(str(plan.root), 1, plan.base, plan.run_id, plan.name, "cpu").errored(
        {"trial": plan.grid_trials[0][0]}, "the worker died"
    )
    assert read("trials", tmp_path)["status"].to_list() == ["failed"]
    again = [*args, "resume=true"]
    outcome = drive(plan_sweep(compose(*again), again), InlineCluster())
    assert outcome.written == 1 and read("trials", tmp_path)["status"].to_list() == ["ok"]


def test_the_orchestration_overhead_leaves_out_a_tasks_evaluation(tmp_path):
    """A trial with a task spends minutes evaluating it after its timed rounds: the driver counted them as the
    orchestration's overhead (wall time less the bench's seconds: 767 s "overhead" beside 12.6 min of evaluation),
    and the ETA's overhead per Tune trial with them."""
    from sweep.bench.command import run_bench
    from sweep.orchestrate.report import trial_report
    from sweep.orchestrate.writer import RowWriter, SweepOutcome, overhead_summary

    row = run_bench(compose(*TINY_SWEEP, "gate=full", f"results.root={tmp_path / 'bench'}"))[1]
    row = {**row, "bench_seconds": 2.0, "task_seconds": 600.0, "trial_seconds": 602.0}  # a task of ten minutes
    writer = RowWriter(str(tmp_path / "sweep"), 1, [], "r", "s", "cpu")
    writer.started("t1")
    writer.result("t1", trial_report(row, 0, cached=False))
    [overhead] = writer.overheads
    assert overhead < -500  # the driver's wall here is well under the row's 602 s of bench and task
    outcome = SweepOutcome(name="s", path="p", root=str(tmp_path), total=1, skipped=0, overhead_s=writer.overheads)
    assert "(driver-observed wall - bench and task time)" in overhead_summary(outcome)


def test_the_start_line_counts_one_setting_and_one_tune_trial_in_the_singular(tmp_path, caplog):
    """A one-setting sweep started with "1 settings in 1 Tune trials"."""
    import logging

    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search.spaces=[{gate: full}]"]
    with caplog.at_level(logging.INFO, logger="sweep.orchestrate.driver"):
        drive(plan_sweep(compose(*args), args), InlineCluster())
    assert any(": 1 setting in 1 Tune trial on " in r.getMessage() for r in caplog.records), caplog.text
