"""Hopeless settings stopped early (`search.min_agreement`): Ray Tune stops a setting whose agreement's bootstrap
interval over its first prompts ends below the bar; its row is `stopped`, never ranked, and a resume does not run it
again. The front above the bar is the one a sweep without stopping finds."""

from __future__ import annotations

import polars as pl
import pytest

from conftest import compose, sweep
from sweep.analysis import agreement_interval, pareto_front
from sweep.errors import ConfigError
from sweep.report.run_report import sweep_report
from sweep.store import read

BAR = 0.9
# a gate that exits at layer 1 on every step (a random tiny model then agrees on almost nothing), one at layer 3
# of 4, and full depth (agreement 1): the first must stop, full depth must not
SPACE = "search.spaces=[{gate: fixed, gate.exit_layer: 'choice(1,3)'},{gate: full}]"
SMALL = ["prompts.n=8", "bench.gen_tokens=8", "bench.repeats=2", SPACE, "sweep.max_concurrent=1"]


@pytest.fixture(scope="module")
def both(ray_session, tmp_path_factory):
    """The same grid with stopping and without it, each into its own root."""
    stopped, full = tmp_path_factory.mktemp("stopped"), tmp_path_factory.mktemp("full")
    with_stop = sweep(stopped, *SMALL, f"search.min_agreement={BAR}", "search.rung_prompts=2")
    without = sweep(full, *SMALL)
    return (stopped, with_stop), (full, without)


def test_a_hopeless_setting_stops_after_its_first_prompts_and_is_never_ranked(both):
    (root, outcome), (full_root, _) = both
    rows = read("trials", root)
    stopped = rows.filter(pl.col("status") == "stopped")
    assert stopped.height >= 1 and set(stopped["gate"]) == {"fixed"}
    assert rows.filter(pl.col("gate") == "full")["status"].to_list() == ["ok"]
    everything = read("trials", full_root)
    for row in stopped.iter_rows(named=True):
        n = row["stopped_at_prompts"]
        assert n in (2, 4) and row["n_prompts"] == n and len(row["prompt_agreement"]) == n
        # the same setting run to the end without stopping: its first prompts agree exactly as the stopped row's
        whole = everything.filter(pl.col("trial_id") == row["trial_id"]).row(0, named=True)
        assert whole["status"] == "ok" and whole["prompt_agreement"][:n] == row["prompt_agreement"]
        # a mean's bootstrap interval ends at most at its largest value, and here below the bar
        assert row["stop_agreement_hi"] < BAR and row["stop_agreement_hi"] <= max(row["prompt_agreement"])
        assert row["stop_agreement_hi"] == agreement_interval(row["prompt_agreement"], row["trial_id"])[1]
        assert row["agreement"] == pytest.approx(sum(row["prompt_agreement"]) / n)
        assert row["speedup_wall"] is None and row["round_ms"] is None  # nothing timed
    assert set(pareto_front(rows, by=("model",))["trial_id"]).isdisjoint(stopped["trial_id"])
    report = sweep_report(outcome)
    assert f"{stopped.height} of {rows.height} settings stopped early" in " ".join(report.split())


def test_the_stop_summary_states_measured_figures_in_the_run_and_the_report(both):
    """What the end of the run and the report's header say of stopped settings: after how many prompts each
    stopped and the bench seconds they spent, read from their rows; no estimate of seconds saved (the median of
    the ok settings overstated it: benchmarks/RESULTS.md)."""
    from sweep.report.build import analyse, markdown

    (root, outcome), _ = both
    rows = read("trials", root)
    stopped = rows.filter(pl.col("status") == "stopped")
    at = " or ".join(str(n) for n in sorted(set(stopped["stopped_at_prompts"])))
    spent = f"they spent {stopped['bench_seconds'].sum():.1f} s of bench in all"
    header, _ = markdown(analyse(compose(f"results.root={root}")))
    for text in (sweep_report(outcome), header):
        said = " ".join(text.split())
        assert f"{stopped.height} of {rows.height} settings stopped early: after their first {at} prompts" in said
        assert spent in said and "saved about" not in said


def test_the_front_above_the_bar_is_the_one_without_stopping(both):
    (root, _), (full_root, _) = both

    def front(path):
        rows = read("trials", path)
        above = pareto_front(rows, by=("model",)).filter(pl.col("agreement") >= BAR)
        return sorted(above["trial_id"])

    assert front(root) == front(full_root)
    assert read("trials", full_root).filter(pl.col("status") == "stopped").height == 0


def test_a_resume_does_not_run_a_stopped_setting_again(both, ray_session):
    (root, outcome), _ = both
    again = sweep(root, *SMALL, f"search.min_agreement={BAR}", "resume=true", f"sweep.name={outcome.name}")
    assert again.written == 0 and read("trials", root).height == 3


@pytest.mark.parametrize(
    "override,message",
    [
        ("search.min_agreement=1.5", "search.min_agreement=1.5: must be a number in [0, 1] or null"),
        ("search.rung_prompts=0", "search.rung_prompts=0: must be an integer in 1..100000"),
    ],
)
def test_bad_stopping_keys_are_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        compose(override)
    assert str(info.value) == message


# ---------------------------------------------------------------- inside a bundle, without Ray

BUNDLE = ["model=tiny-llama", "prompts.n=8", "bench.gen_tokens=8", "bench.repeats=2", "bench.warmup=0"]
SETTINGS = (["gate=fixed", "gate.exit_layer=1"], ["gate=fixed", "gate.exit_layer=3"], ["gate=full"])


def _bundle(*extra: str):
    from sweep.bench.command import prepare
    from sweep.bench.session import Session

    cfgs = [compose(*BUNDLE, *extra, *s) for s in SETTINGS]
    session = Session()
    prepared = [prepare(cfg, session) for cfg in cfgs]
    lm, prompts = prepared[0][0], prepared[0][2]
    return cfgs, lm, [p[1] for p in prepared], prompts


def test_a_setting_stopped_inside_its_bundle_decodes_no_further_and_the_others_keep_the_shared_baseline():
    """The bench asks the check it is given at each rung; the setting it stops runs no gated decode after its
    first prompts, and the two others are timed against one shared baseline exactly as without stopping."""
    from sweep.bench.protocol import Rungs, run_trials

    cfgs, lm, gates, prompts = _bundle()
    asked: list[tuple[int, int]] = []

    def check(setting: int, agreement: list[float]) -> float | None:
        asked.append((setting, len(agreement)))
        return 0.25 if setting == 0 else None  # the first setting stops at its first rung

    events = []
    rows = run_trials(cfgs, lm, gates, prompts, on_event=events.append, rungs=Rungs(2, check))
    first = rows[0]
    assert first["status"] == "stopped" and first["stopped_at_prompts"] == 2 and first["n_prompts"] == 2
    assert first["stop_agreement_hi"] == 0.25 and len(first["prompt_agreement"]) == 2
    assert first["speedup_wall"] is None and first["round_ms"] is None  # nothing timed
    # its gated decodes: its first two prompts, once; never again, in a later rung or a timed round
    assert [e.unit for e in events if e.side == "gated" and e.setting == 0 and e.phase != "warm-up"] == [0, 1]
    assert asked == [(0, 2), (1, 2), (2, 2), (1, 4), (2, 4)]  # the stopped setting is never asked again
    # the others: one shared baseline (one reference, each round's baseline timed once for both)
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"] and {r["baseline_shared"] for r in rows[1:]} == {2}
    assert rows[1]["reference_id"] == rows[2]["reference_id"]
    timed = [e for e in events if e.phase == "round" and e.side == "baseline"]
    assert len(timed) == cfgs[0].bench.repeats * len(prompts)
    # stopping adds no decode to a setting that goes on: its checks read its first timed round's runs
    for s in (1, 2):
        decoded = [e for e in events if e.side == "gated" and e.setting == s and e.phase != "warm-up"]
        assert len(decoded) == cfgs[0].bench.repeats * len(prompts) and {e.phase for e in decoded} == {"round"}
    # and the same measurements of agreement as a run of the three without stopping
    plain = run_trials(cfgs, lm, gates, prompts)
    for stopped, whole in zip(rows[1:], plain[1:]):
        assert stopped["prompt_agreement"] == whole["prompt_agreement"] and stopped["exit_rate"] == whole["exit_rate"]
    assert first["prompt_agreement"] == plain[0]["prompt_agreement"][:2]


def test_a_sweep_worker_stops_a_hopeless_setting_of_its_bundle_by_its_agreement_interval():
    """``search.min_agreement`` in a Tune trial's bundle (the worker's ``trial_rows``, no Ray): a setting whose
    agreement's bootstrap interval over its first prompts ends below the bar is ``stopped`` with that bound; full
    depth, which cannot fall short, is measured against the baseline the bundle kept."""
    import time

    from sweep.orchestrate.worker import trial_rows

    cfgs, _, _, _ = _bundle(f"search.min_agreement={BAR}", "search.rung_prompts=2")
    rows = trial_rows(cfgs, "run", "bundle", time.perf_counter())
    hopeless, full = rows[0], rows[2]
    assert hopeless["status"] == "stopped" and hopeless["stopped_at_prompts"] in (2, 4)
    bound = agreement_interval(hopeless["prompt_agreement"], hopeless["trial_id"])[1]
    assert hopeless["stop_agreement_hi"] == bound < BAR
    assert full["status"] == "ok" and full["agreement"] == 1.0
    live = sum(r["status"] == "ok" for r in rows)
    assert full["baseline_shared"] == live and full["n_prompts"] == 8
