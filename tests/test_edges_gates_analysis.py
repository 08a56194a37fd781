"""Behaviours of the gates and the analysis at their edges that no other test pinned down, each found by changing the
code and seeing every test pass."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from conftest import compose
from helpers.factories import aa_row, simulated_rows, timed_row, trials
from sweep.config import GateConfig


# ---------------------------------------------------------------- gates


def test_a_fixed_gate_at_the_full_depth_layer_probes_nothing():
    """Broken: gate=fixed with exit_layer=L (the full model) probes after layer L, so the bench requires a lens and a
    K/V policy of the model and counts it as a gate that exits."""
    from sweep.gates import make_gate

    assert list(make_gate(GateConfig(name="fixed", exit_layer=4), 4).probe_layers()) == []
    assert list(make_gate(GateConfig(name="fixed", exit_layer=3), 4).probe_layers()) == [3]


def test_the_entropy_gate_exits_at_an_entropy_exactly_its_theta():
    """Broken: a step whose lens entropy equals theta does not exit, though the rule is entropy <= theta."""
    from sweep.gates import make_gate
    from sweep.gates.signals import entropy

    z = torch.zeros(1, 4)  # uniform over four tokens: entropy ln 4
    h = torch.ones(1, 2)
    at = float(entropy(z)[0])
    assert at == pytest.approx(math.log(4), rel=1e-6)
    exits = make_gate(GateConfig(name="entropy", theta=at, min_layer=1), 4).decide(1, h, h, z)
    assert exits.tolist() == [True]
    below = make_gate(GateConfig(name="entropy", theta=at * (1 - 1e-5), min_layer=1), 4).decide(1, h, h, z)
    assert below.tolist() == [False]


def test_calms_decayed_threshold_is_clipped_at_zero():
    """Broken: the cosine gate at eps=1.5 with decay exits on a step whose h_l turned away from h_{l-1} (cos -0.2), as
    the decayed level 0.9 (1 - 1.5) + 0.1 = -0.35 is not clipped to 0."""
    from sweep.gates import Decoding, make_gate
    from sweep.gates.signals import decayed

    assert float(decayed(-0.5, 0, 10, 4.0)) == 0.0
    gate = make_gate(GateConfig(name="cosine", eps=1.5, decay=4.0, min_layer=1), 4)
    h = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    h_prev = torch.tensor([[-0.2, math.sqrt(1 - 0.04)], [0.1, math.sqrt(1 - 0.01)]])  # cos -0.2 and 0.1
    assert gate.decide(1, h, h_prev, None, Decoding(0, 10)).tolist() == [False, True]


def test_a_min_depth_whose_product_is_a_whole_layer_is_that_layer():
    """Broken: gate.min_depth=0.28 on a 25-layer model starts exiting after layer 8, not 7, as 0.28 * 25 is
    7.000000000000001 in floating point and its ceiling 8."""
    from sweep.gates import check_model

    assert 0.28 * 25 > 7  # the floating-point product the rounding is there for
    assert check_model(compose("gate=saturation", "gate.min_depth=0.28").gate, 25).min_layer == 7
    assert check_model(compose("gate=saturation", "gate.min_depth=0.28").gate, 26).min_layer == 8  # ceil(7.28)


def test_the_tuned_lens_translates_the_last_layer_before_l():
    """Broken: the tuned lens leaves h_{L-1} as it is, so at layer L-1 it reads the logit lens, not its translator."""
    from sweep.gates.readouts import Readouts

    L, H = 3, 2
    weights = {
        "translator.weight": torch.stack([torch.zeros(H, H), torch.eye(H)]),  # layer 1: identity map; layer 2: D = I
        "translator.bias": torch.zeros(L - 1, H),
    }
    readouts = Readouts(weights, {"num_layers": str(L)}, "0" * 64)
    h = torch.tensor([[3.0, -1.0]])
    assert torch.equal(readouts.translate(1, h), h)
    assert torch.allclose(readouts.translate(2, h), 2 * h)  # h + r(h) (h / r(h)) I
    assert torch.equal(readouts.translate(3, h), h)


# ---------------------------------------------------------------- analysis: knees


def test_a_chord_knee_tie_goes_to_the_higher_agreement():
    """Broken: of two front points equally far from the chord, the knee is the one that loses more agreement."""
    from sweep.analysis import chord_knees

    # x normalised 0, 0.5, 0.75, 1; both middle points are 0.375 from the chord (exact in binary)
    front = pl.DataFrame(
        {
            "trial_id": ["d", "c", "b", "a"],
            "speedup": [1.0, 2.0, 2.5, 3.0],
            "agreement": [1.0, 0.875, 0.625, 0.0],
        }
    )
    knee = chord_knees(front, by=())
    assert knee["trial_id"].to_list() == ["c"]


def test_kneedle_needs_the_difference_curve_to_drop_below_its_threshold():
    """Broken: a front whose difference curve only touches the threshold is given a Kneedle knee that kneed does not
    find (kneed's rule is strictly below)."""
    from sweep.analysis import kneedle_knee

    front = pl.DataFrame(
        {"trial_id": list("abcde"), "speedup": [0.0, 1.0, 2.0, 3.0, 4.0], "agreement": [1.0, 0.875, 0.75, 0.5, 0.0]}
    )
    # by hand: the difference curve is 0, 0.25, 0.25, 0.125, 0; its last maximum sets the threshold 0.25 - 0.25 (the
    # mean x step) = 0, and the curve ends at 0: on the threshold, never below it
    assert kneedle_knee(front, min_points=5) is None
    try:
        from kneed import KneeLocator
    except ImportError:
        return
    assert KneeLocator([0, 1, 2, 3, 4], [1, 0.875, 0.75, 0.5, 0], curve="concave", direction="decreasing").knee is None


# ---------------------------------------------------------------- analysis: ranking and intervals


def test_a_ratio_of_exactly_1x_that_skipped_nothing_is_not_called_capped():
    """Broken: a trial that skipped no compute and measured exactly 1.000x is reported as capped (a ratio above 1x cut
    to 1x) instead of as a trial whose probes cost time."""
    from sweep.analysis import ranked

    rows = pl.DataFrame(
        {
            "trial_id": ["a", "b", "c"],
            "speedup_wall": [1.0, 1.2, 0.9],
            "mode": ["early_exit"] * 3,
            "exit_rate": [0.0] * 3,
            "step_layers_saved": [0.0] * 3,
            "kv_policy": ["propagate"] * 3,
        }
    )
    got = ranked(rows).collect()
    assert got["capped"].to_list() == [False, True, False]
    assert got["speedup"].to_list() == [1.0, 1.0, 0.9]


def test_the_speedup_interval_is_the_central_95_percent_of_its_bootstrap():
    """Broken: the 95% interval cuts 5% from each tail (a 90% interval), narrower than the level it states."""
    from sweep.analysis import trial_rng, with_confidence
    from sweep.analysis._confidence import bootstrap_speedup

    rng = np.random.default_rng(3)
    base = rng.uniform(9, 11, size=(5, 6)).round(3).tolist()
    gated = rng.uniform(5, 8, size=(5, 6)).round(3).tolist()
    row = timed_row("t1", base, gated)
    row.pop("prompt_agreement")  # the speedup's resamples then come first from the trial's stream
    got = with_confidence(pl.DataFrame([row]), n_boot=400, level=0.95).row(0, named=True)
    boot = bootstrap_speedup(np.asarray(base), np.asarray(gated), trial_rng("t1", 0), 400)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    assert (got["speedup_lo"], got["speedup_hi"]) == pytest.approx((lo, hi), rel=1e-12)
    assert got["ci_level"] == 0.95


def test_the_end_to_end_interval_counts_the_prefill():
    """Broken: the interval of speedup_e2e_wall is the decode-only one, around 2x, while its point is about 1.05x."""
    from sweep.analysis import with_confidence

    base, gated = [[10.0, 10.0, 10.0]] * 3, [[5.0, 5.0, 5.0]] * 3
    prefill = [[100.0, 100.0, 100.0]] * 3
    row = timed_row(
        "t1", base, gated, round_baseline_prefill_ms=prefill, round_prefill_ms=prefill, speedup_e2e_wall=110 / 105
    )
    got = with_confidence(pl.DataFrame([row]), metric="speedup_e2e_wall", n_boot=200).row(0, named=True)
    assert got["speedup"] == pytest.approx(110 / 105)
    assert got["speedup_lo"] == pytest.approx(110 / 105) and got["speedup_hi"] == pytest.approx(110 / 105)


# ---------------------------------------------------------------- analysis: noise floors


def test_the_pooled_floor_is_taken_at_the_trials_median_rounds():
    """Broken: one trial re-timed over 10 rounds sets the rounds of the model's floor, not the median trial's 3."""
    from sweep.analysis import noise_floors

    rows = [
        aa_row("a", [[10.0, 11.0]] * 2, [[10.2, 10.9]] * 2, 2),
        aa_row("b", [[9.0, 9.5]] * 3, [[9.1, 9.4]] * 3, 3),
        aa_row("c", [[8.0, 8.5]] * 10, [[8.3, 8.4]] * 10, 10),
    ]
    floors = noise_floors(pl.DataFrame(rows, infer_schema_length=None)).row(0, named=True)
    assert floors["repeats"] == 3


def test_the_end_to_end_aa_control_adds_its_own_prefill():
    """Broken: the end-to-end A/A ratio adds the baseline's prefill to both sides, hiding an A/A side that prefilled
    three times as slowly (0.5x reads as 1.0x)."""
    from sweep.analysis import noise_floors

    row = aa_row("a", [[10.0]], [[10.0]], 1, prefill=[[10.0]], aa_prefill=[[30.0]])
    floors = noise_floors(pl.DataFrame([row], infer_schema_length=None), metric="speedup_e2e_wall").row(0, named=True)
    assert floors["aa_median"] == pytest.approx(20 / 40)
    decode = noise_floors(pl.DataFrame([row], infer_schema_length=None)).row(0, named=True)
    assert decode["aa_median"] == pytest.approx(1.0)


# ---------------------------------------------------------------- analysis: profiles


def test_a_position_whose_top1_matches_only_at_l_does_not_count_as_exiting_early():
    """Broken: the oracle summary says every position could exit before L, counting those that match only at L."""
    from sweep.analysis import oracle_summary

    rows = [
        {"model": "m", "run_id": "r", "prompt_id": "p", "position": pos, "phase": "decode", "layer": layer,
         "num_layers": 3, "top1_match": match}
        for pos, matches in enumerate([[False, False, True], [False, True, True]])
        for layer, match in enumerate(matches, start=1)
    ]  # fmt: skip
    summary = oracle_summary(pl.DataFrame(rows)).filter(pl.col("phase") == "all").row(0, named=True)
    assert summary["frac_first_match_before_L"] == pytest.approx(0.5)
    assert summary["mean_first_match"] == pytest.approx(2.5)


# ---------------------------------------------------------------- analysis: the screen


def test_the_screen_compares_only_the_settings_it_ran_closed_loop():
    """Broken: a setting the screen did not select, but a measured row shares its id, is counted in its gaps."""
    from sweep.analysis import comparison

    measured = [{"trial_id": t, "status": "ok", "agreement": 0.8, "speedup_wall": 1.2} for t in ("t0", "t1")]
    comp = comparison(simulated_rows([True, False]), measured)
    assert comp["trial_id"].to_list() == ["t0"]
    assert comp["agreement_gap"].to_list() == pytest.approx([0.1])


def test_the_screens_largest_agreement_gap_is_the_maximum():
    """Broken: agreement_gap_max shows the smallest gap of a gate, hiding how optimistic its worst replay was."""
    from sweep.analysis import comparison, gap_by_gate

    measured = [
        {"trial_id": t, "status": "ok", "agreement": a, "speedup_wall": 1.2}
        for t, a in (("t0", 0.85), ("t1", 0.5), ("t2", 0.9))
    ]
    gaps = gap_by_gate(comparison(simulated_rows([True, True, True]), measured)).row(0, named=True)
    assert gaps["trials"] == 3
    assert gaps["agreement_gap_max"] == pytest.approx(0.4)
    assert gaps["agreement_gap_mean"] == pytest.approx((0.05 + 0.4 + 0.0) / 3)


# ---------------------------------------------------------------- analysis: tasks and profiles


def test_a_setting_stopped_early_shares_its_groups_problem_set():
    """Broken: a setting stopped after 3 of 10 problems forms a group of its own, and the tables show a second full
    depth for a 3-problem set no full-depth side ever scored."""
    from sweep.analysis import accuracy_targets, stopped_task_rows

    base = {
        "model": "m",
        "task": "humaneval",
        "task_metric": "pass@1",
        "accuracy_full": 0.6,
        "task_samples": 1,
        "gate": "saturation",
        "task_scores_full": [1.0] * 6 + [0.0] * 4,
    }
    ok = pl.DataFrame(
        [
            {**base, "trial_id": "a", "speedup": 1.5, "accuracy": 0.6, "accuracy_loss": 0.0, "task_problems": 10,
             "accuracy_loss_min": None},
            {**base, "trial_id": "s", "speedup": 2.0, "accuracy": None, "accuracy_loss": None, "task_problems": 3,
             "accuracy_loss_min": 0.2},
        ]
    )  # fmt: skip
    assert stopped_task_rows(ok)["problem_set"].to_list() == [10]
    picks = accuracy_targets(ok, losses=(0.05,))
    assert picks["trial_id"].to_list() == ["a"] and picks["problem_set"].to_list() == [10]


def test_the_layer_curves_percentiles_are_the_10th_below_the_90th():
    """Broken: delta_q10 shows the 90th percentile, so the curve's lower band sits above its median."""
    from sweep.analysis import layer_curve

    n = 11
    trace = pl.DataFrame(
        {"model": ["m"] * n, "layer": [1] * n, "delta": [i / 10 for i in range(n)], "pca_delta": [None] * n,
         "top1_match": [True] * n, "margin": [float(i) for i in range(n)]},
        schema_overrides={"pca_delta": pl.Float64},
    )  # fmt: skip
    row = layer_curve(trace).row(0, named=True)
    assert (row["delta_q10"], row["delta_median"], row["delta_q90"]) == pytest.approx((0.1, 0.5, 0.9))
    assert (row["margin_q10"], row["margin_median"], row["margin_q90"]) == pytest.approx((1.0, 5.0, 9.0))


def test_a_speedup_of_zero_is_not_a_measurement_that_counts():
    """Broken: a row whose speedup_wall is 0 (a failed timing) counts, and without the reference it tops a front."""
    from sweep.analysis import pareto_front

    rows = trials([(0.0, 1.0), (1.5, 0.9), (2.0, 0.8)])
    front = pareto_front(rows, reference=False)
    assert front["trial_id"].to_list() == ["t002", "t001"]


def test_a_replay_without_a_time_stamp_gives_way_to_a_dated_one():
    """Broken: a setting replayed by an older screen whose row has no created_at wins over the newer dated replay."""
    from datetime import datetime, timezone

    from sweep.analysis import distinct_simulated

    simulated = pl.DataFrame(
        {
            "trial_id": ["t1", "t1"],
            "created_at": [datetime(2026, 1, 1, tzinfo=timezone.utc), None],
            "agreement_tf": [0.9, 0.5],
        }
    )
    assert distinct_simulated(simulated)["agreement_tf"].to_list() == [0.9]
    assert distinct_simulated(simulated.reverse())["agreement_tf"].to_list() == [0.9]


def test_a_softmax_margin_of_zero_is_a_setting():
    """Broken: gate=softmax with theta=0 (exit at the first probe), inside its stated domain [0, 1], is refused."""
    from sweep.errors import ConfigError

    assert compose("gate=softmax", "gate.theta=0").gate.theta == 0
    with pytest.raises(ConfigError, match=r"gate.theta=1.5: must be a number in \[0, 1\]"):
        compose("gate=softmax", "gate.theta=1.5")


def test_a_failed_trials_aa_rounds_are_not_in_the_noise_floor():
    """Broken: the A/A rounds of a trial that failed (a disturbed run) count among the model's controls."""
    from sweep.analysis import noise_floors

    rows = [
        aa_row("a", [[10.0, 11.0]] * 2, [[10.2, 10.9]] * 2, 2),
        {**aa_row("b", [[9.0, 9.5]] * 2, [[19.1, 19.4]] * 2, 2), "status": "failed"},
    ]
    floors = noise_floors(pl.DataFrame(rows, infer_schema_length=None)).row(0, named=True)
    assert floors["aa_controls"] == 1 and floors["aa_rounds"] == 2
    assert floors["aa_median"] == pytest.approx(21.0 / 21.1)


def test_the_lens_curves_count_a_prompt_of_each_run_apart():
    """Broken: two runs tracing the same prompt id count as one prompt under the tuned-lens curves."""
    from sweep.analysis import lens_curves

    rows = [
        {"model": "m", "readouts_id": "abc", "run_id": run, "prompt_id": "p", "position": pos,
         "phase": "prefill" if pos == 0 else "decode", "layer": 1, "num_layers": 2, "top1_match": True,
         "tuned_match": True, "kl_final": 0.5, "tuned_kl_final": 0.25}
        for run in ("r1", "r2")
        for pos in (0, 1)
    ]  # fmt: skip
    row = lens_curves(pl.DataFrame(rows)).row(0, named=True)
    assert (row["prompts"], row["positions"]) == (2, 4)


def test_a_fitting_overlap_of_four_prompts_says_there_are_more_than_it_names():
    """Broken: four evaluation prompts in the fitting set are refused naming three, with no sign of the fourth."""
    from types import SimpleNamespace

    from sweep.errors import ConfigError
    from sweep.gates.readouts import check_disjoint, text_digest

    fitted = SimpleNamespace(prompt_set="chat", prompt_ids=list("abcd"), prompt_digests=[text_digest("x")] * 4)
    prompts = [SimpleNamespace(id=i, text=i * 2) for i in "abcd"]
    with pytest.raises(ConfigError, match=r"prompts: 4 of 4 evaluation prompts \(a, b, c, \.\.\.\)"):
        check_disjoint(fitted, prompts)
    with pytest.raises(ConfigError, match=r"prompts: 3 of 3 evaluation prompts \(a, b, c\) are in"):
        check_disjoint(fitted, prompts[:3])


def test_a_kneedle_knee_shared_by_two_settings_names_the_smaller_trial_id():
    """Broken: of two settings at the Kneedle knee (the same speedup and agreement), the cross-check names the larger
    trial id, where the chord knee's ties name the smaller."""
    from sweep.analysis import kneedle_knee

    xs = [1 + i / 10 for i in range(12)]
    front = pl.DataFrame(
        {
            "trial_id": [f"t{i:02d}" for i in range(12)],
            "speedup": xs,
            "agreement": [1 - ((x - 1) / 1.1) ** 3 for x in xs],
        }
    )
    knee = kneedle_knee(front)
    twin = front.filter(pl.col("trial_id") == knee["trial_id"]).with_columns(trial_id=pl.lit("a"))
    assert knee["trial_id"] == "t06"
    assert kneedle_knee(pl.concat([front, twin]))["trial_id"] == "a"


def test_a_task_row_without_a_full_depth_accuracy_makes_no_group():
    """Broken: a model whose full-depth side has no accuracy gets a pick, "full depth" at an accuracy of null."""
    from sweep.analysis import accuracy_targets

    base = {
        "task": "humaneval",
        "task_metric": "pass@1",
        "task_samples": 1,
        "task_problems": 10,
        "gate": "saturation",
        "speedup": 1.5,
        "accuracy": 0.6,
        "accuracy_loss": 0.0,
    }
    ok = pl.DataFrame(
        [{**base, "model": "m1", "trial_id": "a", "accuracy_full": 0.6},
         {**base, "model": "m2", "trial_id": "b", "accuracy_full": None, "accuracy_loss": None}],
        schema_overrides={"accuracy_full": pl.Float64, "accuracy_loss": pl.Float64},
    )  # fmt: skip
    picks = accuracy_targets(ok, losses=(0.05,))
    assert picks["model"].to_list() == ["m1"] and picks["trial_id"].to_list() == ["a"]


def test_a_skip_gates_setting_carries_its_skip_sets_canonical_text():
    """Broken: a skip gate built in code with `a4+m3+a3` carries that text in its row, so one set has two texts and two
    rows that never match."""
    from sweep.gates import make_gate, setting_columns

    cfg = GateConfig(name="skip", skip="a4+m3+a3")
    assert setting_columns(cfg)["skip"] == "a3-4+m3"
    assert make_gate(cfg, 4).values()["skip"] == "a3-4+m3"


def test_a_draft_stop_reads_as_its_shortest_decimal():
    """Broken: a draft_stop of 0.1 + 0.2 is named draft_stop=0.30000000000000004 in the tables and knee labels."""
    from sweep.analysis import params_text

    row = {"gate": "fixed", "exit_layer": 2, "mode": "self_speculative", "draft_len": 4, "draft_stop": 0.1 + 0.2}
    assert params_text(row) == "exit_layer=2 mode=self_speculative draft_len=4 draft_stop=0.3"


def test_a_projection_of_billions_of_rounds_is_a_row_not_an_overflow():
    """An A/A offset just inside the floor target leaves almost no room, and the projected rounds run into the
    billions: `sweep analyze` stopped on polars' overflow of the table's 32-bit column (seen once in CI)."""
    from sweep.analysis import noise_floors

    base, aa = [[10.197], [10.197], [15.0]], [[10.0], [10.0], [10.0]]
    offset = math.log(1.0197)  # the rounds' median ratio
    target = math.expm1(offset + 1e-6)
    got = noise_floors(pl.DataFrame([aa_row("a", base, aa)], infer_schema_length=None), target=target)
    rounds = got.row(0, named=True)["rounds_for_target"]
    spread = math.log1p(got.row(0, named=True)["floor"]) - offset  # the closed form: rounds * (spread / room)^2
    assert rounds > 2**31 and rounds == pytest.approx(3 * (spread / 1e-6) ** 2, rel=1e-3)
