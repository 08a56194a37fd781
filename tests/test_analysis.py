"""Analysis: fronts, knees and targets exactly right on trial sets with known answers;
bootstrap intervals; older files; `sweep analyze` end to end."""

from __future__ import annotations

import math

import polars as pl
import pytest

from conftest import run_cli
from helpers.factories import timed_row, trials, verdict_row
from sweep.analysis import (
    FULL_DEPTH_ID,
    best_at_targets,
    chord_knees,
    fronts,
    kneedle_knee,
    knees_table,
    load_trials,
    ok_trials,
    pareto_front,
    params_text,
    with_confidence,
)
from sweep.cli.commands import main
from sweep.store import read


CLASSIC = [(1.0, 1.0), (1.2, 0.99), (1.5, 0.97), (2.0, 0.5), (2.2, 0.1), (1.1, 0.9), (0.9, 0.95), (1.4, 0.5)]
CLASSIC_FRONT = {"t000", "t001", "t002", "t003", "t004"}


def ids(df: pl.DataFrame) -> list[str]:
    return df["trial_id"].to_list()


def test_front_of_a_classic_set():
    front = pareto_front(trials(CLASSIC), reference=False)
    assert ids(front) == ["t004", "t003", "t002", "t001", "t000"]  # sorted by speedup, descending
    # full depth (1x, agreement 1) is a point of every front: t000 only ties it, so it gives way
    assert ids(pareto_front(trials(CLASSIC))) == ["t004", "t003", "t002", "t001", "full-depth"]


def test_ties_are_all_kept_and_a_tie_dominates_nothing_twice():
    df = trials([(1.5, 0.9), (1.5, 0.9), (1.5, 0.8), (1.0, 0.9), (2.0, 0.5)])
    assert sorted(ids(pareto_front(df, reference=False))) == ["t000", "t001", "t004"]


def test_single_point_and_all_dominated_but_one():
    assert ids(pareto_front(trials([(1.3, 0.7)]), reference=False)) == ["t000"]
    df = trials([(2.0, 1.0), (1.9, 0.99), (1.0, 0.5), (2.0, 0.2)])
    assert ids(pareto_front(df)) == ids(pareto_front(df, reference=False)) == ["t000"]  # t000 dominates full depth


def test_failed_and_nondeterministic_rows_never_count():
    df = pl.concat(
        [
            trials(CLASSIC),
            trials([(9.0, 1.0)], status="failed", start=100),
            trials([(8.0, 1.0)], status="nondeterministic", start=200),
            trials([(7.0, 1.0)], start=300).with_columns(agreement=pl.lit(None, pl.Float64)),
        ]
    )
    assert set(ids(pareto_front(df, reference=False))) == CLASSIC_FRONT


def test_fronts_per_model_and_gate():
    df = pl.concat(
        [
            trials([(1.0, 1.0), (2.0, 0.5)], gate="saturation"),
            trials([(1.5, 0.9), (1.2, 0.8)], gate="margin", start=10),
            trials([(3.0, 0.1)], model="other", start=20),
        ]
    )
    per_gate = pareto_front(df, by=("model", "gate"), reference=False)
    assert {(r["model"], r["gate"], r["trial_id"]) for r in per_gate.iter_rows(named=True)} == {
        ("m", "saturation", "t000"),
        ("m", "saturation", "t001"),
        ("m", "margin", "t010"),
        ("other", "saturation", "t020"),
    }
    across = pareto_front(df, by=("model",), reference=False)
    assert set(ids(across.filter(pl.col("model") == "m"))) == {"t000", "t010", "t001"}
    both = fronts(df, reference=False)
    assert set(both["front"]) == {"model", "model+gate"}
    across_rows = both.filter(pl.col("front") == "model")
    assert set(zip(across_rows["trial_id"], across_rows["gate"])) == {  # each trial keeps its own gate
        ("t000", "saturation"),
        ("t001", "saturation"),
        ("t010", "margin"),
        ("t020", "saturation"),
    }


def test_chord_knee_of_the_classic_front():
    # normalised: t001 (0.167, 0.989) 0.156, t002 (0.417, 0.967) 0.383, t003 (0.833, 0.444) 0.278: t002 is farthest
    knee = chord_knees(pareto_front(trials(CLASSIC)), by=())
    assert ids(knee) == ["t002"] and knee["front_points"].to_list() == [5]


def test_chord_knee_edge_cases():
    # a knee is a bend: fronts of one or two points have none
    assert chord_knees(pareto_front(trials([(1.3, 0.7)])), by=()).height == 0
    assert chord_knees(pareto_front(trials([(1.0, 1.0), (2.0, 0.5)])), by=()).height == 0
    tie = chord_knees(
        pareto_front(trials([(1.0, 1.0), (1.5, 0.9), (1.5, 0.9), (2.0, 0.5)])), by=()
    )  # an exact tie: smaller trial id
    assert ids(tie) == ["t001"]
    both = pl.concat([trials(CLASSIC), trials([(1.0, 1.0)], model="x", start=50)])
    grouped = chord_knees(pareto_front(both, by=("model",)), by=("model",))
    assert dict(zip(grouped["model"], grouped["trial_id"])) == {"m": "t002"}  # model x's front is one point
    table = knees_table(fronts(both))
    assert set(zip(table["front"], table["model"], table["gate"])) == {
        ("model", "m", "saturation"),
        ("model+gate", "m", "saturation"),
    }


def test_knees_of_a_front_with_a_known_corner():
    # 10 points on a gentle line (agreement 1.0 -> 0.955 while speedup 1.0 -> 1.9), then a steep one
    # (0.955 -> 0.0 over 1.9 -> 2.3): the corner (1.9, 0.955), t009, is the knee by construction
    gentle = [(1.0 + 0.1 * i, 1.0 - 0.005 * i) for i in range(10)]
    steep = [(1.9 + 0.08 * j, 0.955 - 0.191 * j) for j in range(1, 6)]
    curve = trials(gentle + steep)
    front = pareto_front(curve)
    assert front.height == 15
    table = knees_table(fronts(curve), min_agreement=0.0)  # every front point a candidate
    row = table.filter(pl.col("front") == "model").row(0, named=True)
    assert row["front_points"] == 15 and row["trial_id"] == "t009" and row["kneedle_trial_id"] == "t009"
    assert row["knee_all_trial_id"] == "t009" and row["knee_points"] == sum(a >= 0.0 for _, a in gentle + steep)
    assert kneedle_knee(front.head(11)) is None  # the cross-check needs 12 points


def test_best_speedup_at_each_target():
    df = pl.concat([trials(CLASSIC), trials([(3.0, 0.9), (1.1, 0.96)], model="low", start=40)])
    best = best_at_targets(df, reference=False)
    got = {(r["model"], r["target"]): r["trial_id"] for r in best.iter_rows(named=True)}
    assert got == {
        ("m", 0.95): "t002",
        ("m", 0.98): "t001",
        ("m", 0.99): "t001",
        ("m", 1.0): "t000",
        ("low", 0.95): "t041",
        ("low", 0.98): None,
        ("low", 0.99): None,
        ("low", 1.0): None,
    }
    # ties on speedup go to the higher agreement, then the smaller trial id
    tied = best_at_targets(trials([(1.5, 0.96), (1.5, 0.99), (1.5, 0.99)]), targets=(0.95,), reference=False)
    assert ids(tied) == ["t001"]


def test_agreement_exactly_at_a_target_reaches_it():
    """3 prompts of 20 tokens, 19 agreeing in each: 57 of 60 positions, 0.95 exactly. A float mean of the three
    fractions is 0.9499999999999998, which a target of 0.95 would refuse; the row's agreement is the exact mean."""
    from sweep.bench.estimators import mean_agreement

    agreement = mean_agreement([19 / 20] * 3)
    assert agreement == 0.95 == 57 / 60
    assert mean_agreement([9 / 10] * 7) == 0.9 and mean_agreement([0.5, 1.0]) == 0.75
    best = best_at_targets(trials([(1.5, agreement)]), targets=(0.95,), reference=False)
    assert ids(best) == ["t000"]


def test_settings_that_rank_equal_go_to_the_higher_measured_speedup_then_agreement():
    """Inside their noise floors both rank 1.0x: the best setting there is the one measured faster (0.961x over
    0.915x), then the one that agrees more; full depth still wins every tie it is in."""
    inside = trials([(0.915, 1.0), (0.961, 1.0), (0.961, 0.99)]).with_columns(noise_floor=pl.lit(0.1))
    assert ok_trials(inside).collect()["speedup"].to_list() == [1.0, 1.0, 1.0]  # all indistinguishable from 1x
    best = best_at_targets(inside, targets=(0.95, 1.0), reference=False)
    assert ids(best) == ["t001", "t001"]
    measured_first = best_at_targets(inside.filter(pl.col("trial_id") != "t001"), targets=(0.95,), reference=False)
    assert ids(measured_first) == ["t002"]  # 0.961x at agreement 0.99 over 0.915x at 1.0: measured, then agreement
    assert ids(best_at_targets(inside, targets=(0.95,))) == [FULL_DEPTH_ID]


def frame(*rows) -> pl.DataFrame:
    return pl.DataFrame(list(rows), infer_schema_length=None)


def test_speedup_interval_bootstraps_the_reported_estimator():
    # per-prompt medians would give (20 + 10) / (10 + 20) = 1.0 (the old interval's statistic); the
    # reported estimator is the median over rounds of the rounds' pooled ratios
    base, gated = [[10.0, 10.0], [30.0, 10.0]], [[9.0, 9.0], [11.0, 30.0]]
    row = with_confidence(frame(timed_row("a1", base, gated)), n_boot=4000, seed=3).row(0, named=True)
    assert row["speedup_wall"] == pytest.approx((20 / 18 + 40 / 41) / 2)
    # brute force: every resample of (rounds, prompts), each with probability 1/16; both ends of a 95%
    # interval fall in the extreme resamples
    values = []
    for r0 in range(2):
        for r1 in range(2):
            for p0 in range(2):
                for p1 in range(2):
                    ratio = [(base[r][p0] + base[r][p1]) / (gated[r][p0] + gated[r][p1]) for r in (r0, r1)]
                    values.append(sum(ratio) / 2)
    assert row["speedup_lo"] == pytest.approx(min(values)) and row["speedup_hi"] == pytest.approx(max(values))
    assert row["speedup_lo"] <= row["speedup"] == row["speedup_wall"] <= row["speedup_hi"]


def test_intervals_contain_their_estimates_and_agreement_resamples_prompts():
    import random

    rng = random.Random(7)
    rows = []
    for t in range(40):
        rounds, n = rng.choice([1, 2, 3]), rng.choice([2, 3, 8])
        base = [[rng.uniform(5, 50) for _ in range(n)] for _ in range(rounds)]
        gated = [[b * rng.uniform(0.4, 1.6) for b in rb] for rb in base]
        rows.append(timed_row(f"t{t:02d}", base, gated, agree=[rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]))
    out = with_confidence(frame(*rows), n_boot=500, seed=0)
    for r in out.iter_rows(named=True):
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"], r["trial_id"]
        assert r["agreement_lo"] <= r["agreement"] <= r["agreement_hi"], r["trial_id"]
    agree = with_confidence(
        frame(timed_row("x", [[1.0, 1.0, 1.0, 1.0]], [[1.0] * 4], agree=[0.0, 1.0, 0.5, 0.5])), n_boot=4000, seed=0
    ).row(0, named=True)
    # brute force over the 256 resamples of 4 prompts: the extremes have probability 1/256 each, so the
    # 2.5% quantile lies above the minimum 0.0 and below the mean
    assert 0.0 < agree["agreement_lo"] < 0.5 < agree["agreement_hi"] < 1.0


def test_a_trial_gets_the_same_interval_whatever_rows_come_with_it():
    one = timed_row(
        "same", [[10.0, 12.0, 9.0], [11.0, 10.0, 9.5]], [[8.0, 9.0, 9.0], [9.0, 10.0, 7.0]], agree=[1.0, 0.5, 0.75]
    )
    others = [timed_row(f"o{i}", [[5.0 + i, 6.0]], [[4.0, 6.0 + i]]) for i in range(5)]
    cols = ["speedup_lo", "speedup_hi", "agreement_lo", "agreement_hi"]
    alone = with_confidence(frame(one), seed=2).select(cols)
    last = with_confidence(frame(*others, one), seed=2).filter(pl.col("trial_id") == "same").select(cols)
    assert alone.equals(last)
    from sweep.analysis import trial_rng

    assert trial_rng("same", 2).integers(0, 2**31) == trial_rng("same", 2).integers(0, 2**31)
    assert trial_rng("same", 3).integers(0, 2**31) != trial_rng("same", 2).integers(
        0, 2**31
    )  # the analysis seed still matters


def test_trials_that_skipped_no_compute_are_capped_from_above_only_and_never_win_a_front():
    base = [[10.0, 10.0], [10.0, 10.0]]
    rows = [
        timed_row("noise", base, [[6.0, 7.0], [6.5, 6.5]], exit_rate=0.0),  # no exit, measured 1.5x
        timed_row("fullkv", base, [[7.0, 7.0], [7.0, 7.0]], kv_policy="full"),  # exits, but runs every layer anyway
        timed_row("fullcost", base, [[16.0, 17.0], [17.0, 16.0]], kv_policy="full"),  # and pays a head: 0.606x
        timed_row("real", base, [[8.0, 8.0], [8.0, 8.0]], agree=[1.0, 0.9]),  # exits: 1.25x
        timed_row("spec", base, [[9.0, 9.0], [9.0, 9.0]], exit_rate=0.0, mode="self_speculative"),  # drafts skip layers
    ]
    out = {r["trial_id"]: r for r in with_confidence(frame(*rows), seed=0).iter_rows(named=True)}
    assert out["noise"]["speedup"] == 1.0 and out["noise"]["speedup_noise"] == pytest.approx(20 / 13)
    assert out["noise"]["capped"] and out["fullkv"]["capped"] and not out["real"]["capped"]
    assert out["fullkv"]["speedup"] == 1.0 and not out["fullkv"]["skipped_compute"]
    assert out["noise"]["speedup_lo"] == out["noise"]["speedup_hi"] == 1.0  # every resample is capped as well
    # a slowdown is never raised to 1.0: the head the exit ran and the model's own head are a real cost
    assert out["fullcost"]["speedup"] == pytest.approx(20 / 33) and not out["fullcost"]["capped"]
    assert out["fullcost"]["speedup_hi"] < 1.0
    assert out["real"]["speedup"] == pytest.approx(1.25) and out["real"]["speedup_noise"] is None
    assert out["spec"]["skipped_compute"] and out["spec"]["speedup"] == pytest.approx(10 / 9)
    front = pareto_front(frame(*rows))
    assert "noise" not in ids(front) and "fullkv" not in ids(front) and "real" in ids(front)
    assert "fullcost" not in ids(front)  # full depth dominates it
    assert "full-depth" not in ids(front)  # lossless self-speculation at 1.11x dominates full depth itself
    assert "full-depth" in ids(pareto_front(frame(*rows[:4])))


def test_intervals_from_few_prompts_are_flagged():
    two = timed_row("two", [[1.0, 2.0]], [[1.0, 1.0]])
    eight = timed_row("eight", [[1.0] * 8], [[0.5] * 8])
    out = {r["trial_id"]: r for r in with_confidence(frame(two, eight), seed=0).iter_rows(named=True)}
    assert out["two"]["ci_few_prompts"] and out["two"]["ci_prompts"] == 2
    assert not out["eight"]["ci_few_prompts"]
    assert with_confidence(frame(eight), seed=0, min_prompts=9)["ci_few_prompts"].to_list() == [True]
    from sweep.report.build import verdict

    # 8 prompts decoded in 2 batches of 4: the speedup interval resamples the 2 batches (its timings are per batch)
    batched = timed_row("batched", [[4.0, 4.0]] * 3, [[2.0, 2.5]] * 3, agree=[1.0] * 8)
    row = with_confidence(frame(batched), seed=0).row(0, named=True)
    assert (row["ci_prompts"], row["ci_units"], row["ci_few_prompts"]) == (8, 2, True)
    assert "[interval from 2 batches, fewer than 8: too coarse to trust]" in verdict({**row, "params": "eps=0.1"}, 8)


FULL = verdict_row(
    trial_id="full-depth", gate="full", params="full depth", mode="early_exit", skipped_compute=False, speedup=1.0
)


def test_verdicts_follow_each_modes_own_evidence():
    from sweep.report.build import verdict

    faster = verdict(verdict_row(speedup=1.6, speedup_lo=1.4, speedup_hi=1.8), 8)
    assert "with a speedup: lossless self-speculation" in faster and "1.600x" in faster and "cost more" not in faster
    slower = verdict(FULL, 8, verdict_row(speedup=0.8, speedup_lo=0.7, speedup_hi=0.9, acceptance_rate=0.2))
    assert slower.startswith("no setting beats full depth") and "drafting and verifying cost more" in slower
    unsure = verdict(verdict_row(speedup=1.05, speedup_lo=0.95, speedup_hi=1.15, ci_prompts=2, ci_few_prompts=True), 8)
    assert "distinguishable from 1x" in unsure and "fewer than 8" in unsure
    idle = dict(mode="early_exit", gate="margin", params="theta=20", skipped_compute=False, exit_rate=0.0)
    capped = verdict(FULL, 8, verdict_row(**idle, speedup=1.0, speedup_wall=1.52, capped=True, speedup_noise=1.52))
    assert "skipped no compute" in capped and "timing noise" in capped and "(measured 1.520x)" in capped
    cost = verdict(FULL, 8, verdict_row(**idle, speedup=0.6, speedup_noise=0.6))
    assert "0.600x" in cost and "probes and heads cost real time" in cost and "with a speedup" not in cost
    noise = verdict(
        FULL,
        8,
        verdict_row(
            mode="early_exit", params="exit_layer=9", speedup=1.0, speedup_wall=1.02, within_noise=True, exit_rate=0.9
        ),
    )
    assert "inside its A/A noise floor of +-3.0%" in noise and "(measured 1.020x)" in noise
    exits = verdict(
        verdict_row(mode="early_exit", gate="margin", params="theta=5", speedup=1.3, speedup_lo=1.1, exit_rate=0.4), 8
    )
    assert "with a speedup: margin theta=5" in exits
    assert verdict(FULL, 8, None).startswith("no setting reaches agreement >=")


def test_a_verdict_names_a_ranked_figure_as_ranked_not_as_the_column_it_differs_from():
    """Before: "speedup_wall 1.000x (measured 0.897x)", where the speedup_wall column holds 0.897."""
    from sweep.report.build import verdict

    idle = dict(mode="early_exit", gate="margin", params="theta=20", skipped_compute=False, exit_rate=0.0)
    capped = verdict(FULL, 8, verdict_row(**idle, speedup=1.0, speedup_wall=1.52, capped=True, speedup_noise=1.52))
    assert "speedup_wall ranked 1.000x (measured 1.520x)" in capped and "speedup_wall 1.000x" not in capped


def test_an_unsure_pick_gives_way_to_the_fastest_setting_distinguishable_from_1x():
    """The verdict's pick at its target is the fastest setting; where its speedup's interval includes 1x, the answer
    is the fastest slower setting whose interval lies above 1x (sought past the first few candidates), else none."""
    from sweep.report.build import sure_at, targets_at
    from sweep.report.verdicts import model_verdicts
    from sweep.store import TABLES

    base = [[10.0, 10.0]] * 3
    noisy = [[5.0, 5.0], [20.0, 20.0], [20 / 3, 20 / 3]]  # round ratios 2, 0.5, 1.5: 1.5x, interval [0.5, 2]
    rows = [timed_row(f"noisy{i}", base, [[g * (1 + i / 100) for g in r] for r in noisy]) for i in range(9)]
    steady = timed_row("steady", base, [[8.0, 8.0]] * 3)  # 1.25x every round: its interval lies above 1x
    conf = {"metric": "speedup_wall", "n_boot": 1000, "seed": 0, "min_prompts": 2}

    def said(*rows):
        trials = frame(*rows)
        typed = [pl.lit(None, dtype=c.dtype).alias(c.name) for c in TABLES["trials"].columns]
        trials = trials.with_columns(c for c in typed if c.meta.output_name() not in trials.columns)
        ok = ok_trials(trials, "speedup_wall").collect()
        targets = targets_at(ok, (0.98,), conf)
        settings = targets_at(ok, (0.98,), conf, reference=False)
        sure = sure_at(ok, targets, 0.98, conf)
        return model_verdicts(trials, targets, settings, 2, target=0.98, sure=sure)[0]

    line = said(*rows, steady)
    assert line.startswith("m: agreement >= 0.98 with a speedup: saturation eps=0.1 min_layer=2, speedup_wall 1.250x")
    assert "(the fastest there, saturation eps=0.1 min_layer=2, speedup_wall 1.500x" in line
    assert "but its interval includes 1x" in line and "no gate reaches" not in line
    alone = said(*rows)
    assert alone.startswith("m: no gate reaches agreement >= 0.98 with a speedup distinguishable from 1x")
    assert "no slower setting's lies above 1x" in alone


def bench_rows(root, *gates):
    for gate in gates:
        assert (
            main(
                [
                    "bench",
                    "model=tiny-llama",
                    "prompts.n=2",
                    "bench.gen_tokens=6",
                    "bench.repeats=2",
                    "bench.warmup=0",
                    f"results.root={root}",
                    *gate,
                ]
            )
            == 0
        )


def test_analyze_writes_tables_report_and_figures(tmp_path, capsys):
    bench_rows(
        tmp_path,
        ["gate=full"],
        ["gate=fixed", "gate.exit_layer=2"],
        ["gate=fixed", "gate.exit_layer=3"],
        ["gate=saturation", "gate.eps=0.8", "gate.min_layer=2"],
        ["gate=margin", "gate.theta=0.4", "gate.min_layer=1"],
    )
    assert main(["profile", "model=tiny-llama", "prompts.n=1", "profile.gen_tokens=4", f"results.root={tmp_path}"]) == 0
    capsys.readouterr()
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny-llama: ") and f"report: {tmp_path}/report/report.md" in out
    pareto, knees, targets = read("pareto", tmp_path), read("knees", tmp_path), read("targets", tmp_path)
    assert set(pareto["front"]) == {"model", "model+gate"} and pareto["agreement_lo"].null_count() == 0
    assert (knees["front_points"] >= 3).all() and targets["target"].to_list() == [0.95, 0.98, 0.99, 1.0]
    per_gate = pareto.filter(pl.col("front") == "model+gate").group_by("front_gate").len()
    expected = {("model+gate", g) for g in per_gate.filter(pl.col("len") >= 3)["front_gate"]} | (
        {("model", None)} if pareto.filter(pl.col("front") == "model").height >= 3 else set()
    )
    named = {(r["front"], r["front_gate"]) for r in knees.iter_rows(named=True)}
    assert named == expected  # fronts of 1-2 points have no knee
    # full depth is a point of every front unless a setting dominates it
    for (front, gate), sub in pareto.partition_by("front", "front_gate", as_dict=True).items():
        beaten = sub.filter((pl.col("speedup") > 1.0) & (pl.col("agreement") >= 1.0))
        assert ("full-depth" in sub["trial_id"].to_list()) == (beaten.height == 0), (front, gate)
    for table in (pareto, targets.drop_nulls("trial_id")):
        assert (table["speedup_lo"] <= table["speedup"]).all() and (table["speedup"] <= table["speedup_hi"]).all()
        assert (table["agreement_lo"] <= table["agreement"]).all() and (
            table["agreement"] <= table["agreement_hi"]
        ).all()
        assert table["ci_few_prompts"].all()  # 2 prompts: flagged
    for r in pareto.filter(~pl.col("skipped_compute") & (pl.col("trial_id") != "full-depth")).iter_rows(named=True):
        capped = min(r["speedup_wall"], 1.0)  # from above only: a slowdown stays
        inside = abs(math.log(capped)) <= math.log1p(r["noise_floor"])
        assert r["within_noise"] == inside and r["speedup"] == pytest.approx(1.0 if inside else capped)
    assert targets.filter(pl.col("target") == 1.0)["agreement"][0] == 1.0  # the full gate always qualifies
    report = (tmp_path / "report" / "report.md").read_text()
    for name in ("pareto_tiny-llama.png", "layers_tiny-llama.png", "eas.png"):
        assert (tmp_path / "report" / name).stat().st_size > 10_000 and f"({name})" in report
    assert "Best speedup at each agreement target" in report and "EAS (arXiv 2603.23701)" in report
    # targets without 0.98: the verdict is at the nearest of them, the targets table's row
    assert main(["analyze", f"results.root={tmp_path}", "analysis.targets=[0.9,0.99]"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    row = read("targets", tmp_path).filter(pl.col("target") == 0.99).row(0, named=True)
    # (not "0.98" alone: a measured ratio of 0.988x holds it)
    assert "tiny-llama: " in said and "agreement >= 0.99" in said and "agreement >= 0.98" not in said
    assert ("no gate reaches" in said) == (row["trial_id"] is None)


def test_a_setting_timed_again_over_more_rounds_ranks_by_that_row_alone(tmp_path):
    """An Optuna search's row of a setting and its re-time to the floor target (the same key but for bench.repeats)
    both ranked, so the front could name the luckier 2-round draw over the re-timed row of the same setting.
    The row timed over more rounds ranks; another setting, and a row of the same key, are not touched."""
    from sweep.analysis import ok_trials, pareto_front

    gate = ["gate=fixed", "gate.exit_layer=2"]
    bench_rows(tmp_path, gate, [*gate, "bench.repeats=4"], ["gate=fixed", "gate.exit_layer=3"])
    rows = read("trials", tmp_path)
    by = {(r["exit_layer"], r["repeats"]): r["trial_id"] for r in rows.iter_rows(named=True)}
    assert set(by) == {(2, 2), (2, 4), (3, 2)}
    assert set(ok_trials(rows, ranks=True).collect()["trial_id"]) == {by[(2, 4)], by[(3, 2)]}
    assert by[(2, 2)] not in set(pareto_front(rows)["trial_id"])
    copy = rows.filter(pl.col("trial_id") == by[(3, 2)]).with_columns(trial_id=pl.lit("copy000000000000"))
    assert set(ok_trials(pl.concat([rows, copy]), ranks=True).collect()["trial_id"]) == {
        by[(2, 4)],
        by[(3, 2)],
        "copy000000000000",
    }


def test_the_reports_count_says_which_ok_rows_it_does_not_rank(tmp_path):
    """A reader's report said "30 trials ...; 29 ok, 0 nondeterministic, 0 failed, 0 stopped early" of 30 ok rows
    (an Optuna search's row re-timed over more rounds is not ranked) beside a verdict of "(30 ok trials)"."""
    from conftest import compose
    from sweep.report.build import analyse
    from sweep.report.sections import header

    gate = ["gate=fixed", "gate.exit_layer=2"]
    bench_rows(tmp_path, gate, [*gate, "bench.repeats=4"], ["gate=fixed", "gate.exit_layer=3"])
    said = " ".join(" ".join(header(analyse(compose(f"results.root={tmp_path}"))).lines).split())
    assert (
        "3 trials from 3 run(s); 3 ok (2 ranked; not ranked: 1 earlier row(s) of settings timed again over more "
        "rounds), 0 nondeterministic" in said
    ), said


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_the_report_is_its_sections_in_order_written_once(tmp_path):
    from conftest import compose
    from sweep.report.build import analyse, write_report
    from sweep.report.sections import SECTIONS

    bench_rows(tmp_path, ["gate=full"], ["gate=full", "bench.batch_size=2"], ["gate=fixed", "gate.exit_layer=2"])
    assert main(["profile", "model=tiny-llama", "prompts.n=1", "profile.gen_tokens=4", f"results.root={tmp_path}"]) == 0
    ctx = analyse(compose(f"results.root={tmp_path}"))
    sections = [section(ctx) for section in SECTIONS]
    for section in sections:  # a section is nothing, or a block that starts with text and ends with a blank line
        assert not section.lines or (section.lines[0] != "" and section.lines[-1] == "")
        for name in section.figures:
            assert (ctx.out / name).stat().st_size > 10_000 and f"![{name}]({name})" in section.lines
    headings = [line for s in sections for line in s.lines if line.startswith("#")]
    assert headings == [
        "# Early-exit report",
        "## Verdicts",
        "## tiny-llama",
        "## Profiles: EAS and oracle exits",
        "## The batching effect",
    ]
    path = write_report(ctx)
    text = path.read_text()
    assert text == "\n".join(line for s in sections for line in s.lines)
    assert write_report(ctx).read_text() == text  # written whole, never appended to
    assert [p.name for p in ctx.out.iterdir() if p.suffix == ".md"] == ["report.md"]


def test_older_files_are_analysed_too(tmp_path, capsys):
    bench_rows(tmp_path, ["gate=full"], ["gate=fixed", "gate.exit_layer=2"])
    path = next((tmp_path / "trials").rglob("*.parquet"))
    old = pl.read_parquet(path).drop("prompt_baseline_ms", "prompt_ms", "min_depth", "sweep_name")
    old.write_parquet(path)  # as a file from before those columns existed
    assert load_trials(tmp_path).collect().height == 2
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    pareto = read("pareto", tmp_path)
    assert pareto.height >= 1


def test_a_file_where_the_report_goes_is_refused_before_anything_is_written(tmp_path, capsys):
    bench_rows(tmp_path, ["gate=full"], ["gate=fixed", "gate.exit_layer=2"])
    (tmp_path / "report").write_text("not a folder")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    assert main(["analyze", f"results.root={tmp_path}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"analysis.out={tmp_path}/report: is a file, not a directory" in err[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no table, no staging
    (tmp_path / "report").unlink()
    assert main(["analyze", f"results.root={tmp_path}"]) == 0 and read("pareto", tmp_path).height >= 1


def test_analyze_on_nothing_is_one_clear_error(tmp_path):
    res = run_cli("analyze", f"results.root={tmp_path}/none")
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: results.root={tmp_path}/none: no trials or profiles there to analyze (run `sweep run` or `sweep "
        f"profile` first)"
    ]


def test_targets_config_is_validated():
    from conftest import compose
    from sweep.errors import ConfigError

    assert compose("analysis.targets=[0.9]").analysis.targets == [0.9]
    with pytest.raises(ConfigError, match=r"analysis.targets=\[1.5\]: must be a non-empty list of numbers in \[0, 1\]"):
        compose("analysis.targets=[1.5]")
    assert math.isclose(compose().analysis.targets[1], 0.98)
    # a target given twice made two rows of targets.parquet for one pick
    with pytest.raises(ConfigError, match=r"analysis.targets=\[0.98, 0.98\]: .* each once"):
        compose("analysis.targets=[0.98,0.98]")


def test_the_readme_polars_example_runs(tmp_path, monkeypatch, capsys):
    from conftest import ROOT

    bench_rows(tmp_path / "results", ["gate=full"], ["gate=fixed", "gate.exit_layer=2"])
    readme = (ROOT / "README.md").read_text()
    block = readme.split("three lines of polars")[1].split("```python")[1].split("```")[0]
    assert len(block.strip().splitlines()) == 3
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "speedup_wall" in out and "tiny-llama" in out


def test_the_report_shows_the_batching_effect(tmp_path, capsys):
    for size in (1, 2, 4):
        assert (
            main(
                [
                    "bench",
                    "model=tiny-llama",
                    "gate=saturation",
                    "gate.eps=0.8",
                    "gate.min_layer=2",
                    f"bench.batch_size={size}",
                    "prompts.n=4",
                    "bench.gen_tokens=6",
                    "bench.repeats=1",
                    "bench.warmup=0",
                    f"results.root={tmp_path}",
                ]
            )
            == 0
        )
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## The batching effect" in report and (tmp_path / "report" / "batching.png").stat().st_size > 10_000
    assert (
        report.count("| tiny-llama saturation eps=0.8 min_layer=2 kv_policy=propagate |") == 3
    )  # the series names its K/V policy


def test_the_batching_section_keeps_workloads_apart_and_shows_the_ranked_speedup(tmp_path):
    """Before: rows of one setting on two workloads (other prompts.n, gen_tokens) made one series, batch 1 shown
    twice and its line drawn up and down at one batch size; and the table showed the raw speedup_wall where every
    other table shows the speedup the tables rank by (1 inside the trial's A/A floor, capped without a skip)."""
    from conftest import compose
    from sweep.report.build import analyse
    from sweep.report.sections import batching_section

    gate = ["gate=saturation", "gate.eps=0.8", "gate.min_layer=2"]
    bench_rows(tmp_path, [*gate, "bench.batch_size=1"], [*gate, "bench.batch_size=2"])  # 2 prompts x 6 tokens
    for size in (1, 2):
        args = ["bench", "model=tiny-llama", "prompts.n=4", "bench.gen_tokens=4", "bench.repeats=2", "bench.warmup=0"]
        assert main([*args, *gate, f"bench.batch_size={size}", f"results.root={tmp_path}"]) == 0
    ctx = analyse(compose(f"results.root={tmp_path}"))
    lines = batching_section(ctx).lines
    head = next(line for line in lines if line.startswith("| setting |"))
    assert head.split("|")[3].strip() == "speedup"
    cells = [line.split("|") for line in lines if line.startswith("| tiny-llama ")]
    series = {}
    for cell in cells:
        series.setdefault(cell[1].strip(), []).append(int(cell[2]))
    assert len(series) == 2 and all(sizes == [1, 2] for sizes in series.values()), series
    assert {("n_prompts=2" in s, "gen_tokens=6" in s, "n_prompts=4" in s) for s in series} == {
        (True, True, False),
        (False, False, True),
    }
    ranked = {(r["batch_size"], r["gen_tokens"]): r for r in ctx.ok.iter_rows(named=True) if r["gate"] == "saturation"}
    for cell in cells:
        r = ranked[(int(cell[2]), 6 if "gen_tokens=6" in cell[1] else 4)]
        shown = cell[3].strip()
        assert shown.startswith("≈1x") if r["within_noise"] else shown.split()[0] == f"{r['speedup']:.3f}", shown


def test_self_speculative_trials_stay_out_of_the_batching_section(tmp_path, capsys):
    common = [
        "model=tiny-llama",
        "gate=fixed",
        "gate.exit_layer=2",
        "prompts.n=2",
        "bench.gen_tokens=6",
        "bench.repeats=1",
        "bench.warmup=0",
        f"results.root={tmp_path}",
    ]
    assert main(["bench", *common, "bench.batch_size=2"]) == 0
    assert (
        main(["bench", *common, "bench.mode=self_speculative", "bench.draft_len=2"]) == 0
    )  # batch 1, same gate columns
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## The batching effect" not in report  # one early-exit batch size only: nothing to compare
    targets = read("targets", tmp_path).filter(pl.col("target") == 1.0)
    spec = best_at_targets(read("trials", tmp_path), reference=False).filter(pl.col("target") == 1.0)
    assert spec["mode"].to_list() == ["self_speculative"]  # lossless, so the only setting at agreement 1
    assert params_text(spec.row(0, named=True)) == "exit_layer=2 min_layer=1 mode=self_speculative draft_len=2"
    # the targets table names it only where it beats full depth, which is always a candidate there
    assert targets["trial_id"][0] == (spec["trial_id"][0] if spec["speedup"][0] > 1.0 else "full-depth")


def test_params_text_names_mode_and_batch_size():
    row = {"eps": 0.2, "min_layer": 8, "mode": "early_exit", "batch_size": 1}
    assert params_text(row) == "eps=0.2 min_layer=8"
    assert params_text({**row, "batch_size": 4}) == "eps=0.2 min_layer=8 batch_size=4"
    assert params_text({"exit_layer": 15, "min_layer": 15, "mode": "self_speculative", "draft_len": 4}) == (
        "exit_layer=15 min_layer=15 mode=self_speculative draft_len=4"
    )
    spec = {"skip": "a2+m3", "mode": "self_speculative", "draft_len": 2, "draft_stop": 0.3}
    assert params_text(spec) == "skip=a2+m3 mode=self_speculative draft_len=2 draft_stop=0.3"
    assert params_text({**spec, "draft_stop": None}) == "skip=a2+m3 mode=self_speculative draft_len=2"


def test_the_verdicts_target_is_098_or_the_nearest_given_the_higher_of_two_as_near():
    from sweep.report.plotting import headline_target

    assert headline_target([0.95, 0.98, 0.99, 1.0]) == 0.98 and headline_target([0.9, 0.99]) == 0.99
    assert headline_target([0.97, 0.99]) == 0.99 and headline_target([0.5, 0.96]) == 0.96
