"""Behaviours of the traces, the fits and the noise floors at their edges that no other test pinned down, each found by
changing the code and seeing every test pass."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import polars as pl
import pytest
import torch

from conftest import compose
from helpers.factories import aa_row, cost_model, simulated_rows
from sweep.config import GateConfig

# ---------------------------------------------------------------- calibrate


def test_the_bentkus_term_counts_a_fractional_number_of_losses_up():
    """Broken: a calibration risk of half a loss (n * risk = 0.5) is counted as zero losses in the Bentkus term, and
    the p-value drops to e * 0.9^40 = 0.040 below the 0.072 the Hoeffding term alone allows."""
    from sweep.trace.calibrate import hoeffding_bentkus_p

    n, risk, delta = 40, 0.0125, 0.1
    h1 = risk * math.log(risk / delta) + (1 - risk) * math.log((1 - risk) / (1 - delta))
    bentkus = math.e * sum(math.comb(n, i) * delta**i * (1 - delta) ** (n - i) for i in range(2))  # P(Bin <= 1)
    assert hoeffding_bentkus_p(risk, n, delta) == pytest.approx(min(1.0, math.exp(-n * h1), bentkus))


def test_the_calibration_split_rounds_its_share_to_nearest():
    """Broken: calibrate.split=0.66 of 10 prompts calibrates on 6 (the share cut down), not the 7 it rounds to."""
    from sweep.trace.calibrate import split

    cal, held = split(list(range(10)), 0.66, 0)
    assert (len(cal), len(held)) == (7, 3)


def _calibration(holdout_risk: float, drift_risk: float) -> str:
    from sweep.trace.calibrate import Calibration, format_calibration

    result = Calibration("margin", "theta", tested=[20.0], risks=[0.0], pvalues=[0.01], exit_rates=[0.5], chosen=20.0,
                         holdout_risk=holdout_risk, holdout_exit_rate=0.5, n_cal=30, n_holdout=10, drift_set="chat",
                         drift_risk=drift_risk, drift_exit_rate=0.4, n_drift=4)  # fmt: skip
    return format_calibration(compose("gate=margin", "calibrate.delta=0.1"), result)


def test_a_held_out_risk_exactly_delta_holds():
    """Broken: a held-out disagreement of exactly calibrate.delta is reported EXCEEDED, though risk <= delta is what
    the guarantee promises."""
    assert "held-out check: observed disagreement 0.1000 on 10 prompts (exit rate 0.500): holds" in _calibration(0.1, 0)


def test_the_drift_is_the_drift_sets_risk_above_the_held_out_ones():
    """Broken: a drift set that disagrees more than the held-out prompts (0.15 against 0.05) shows -0.1000."""
    text = _calibration(0.05, 0.15)
    assert "observed disagreement 0.1500 (exit rate 0.400), +0.1000 against the held-out prompts: EXCEEDED" in text


# ---------------------------------------------------------------- simulate


def test_the_replays_speedup_prices_the_decode_steps_only():
    """Broken: the cost model's speedup also prices the first token (decided on the prefill), which the bench does
    not time as a step: a prompt whose first token exits at layer 1 reads faster than its decode steps are."""
    from sweep.gates import make_gate
    from sweep.trace.simulate import Signals, simulate

    L = 4
    zeros = torch.zeros(2, L)
    margin = torch.tensor([[9.0] * L, [0.0] * L])  # the first token exits at layer 1, the decode step never
    sig = Signals(delta=zeros, margin=margin, match=torch.ones(2, L, dtype=torch.bool),
                  prompt_index=torch.zeros(2, dtype=torch.long), token_index=torch.tensor([0, 1]),
                  prefill_residual=[zeros], prompt_ids=["p"], gen_tokens=2)  # fmt: skip
    costs, cfg = cost_model(L), GateConfig(name="margin", theta=1.0, min_layer=1)
    row = simulate([cfg], sig, costs).row(0, named=True)
    assert row["exit_rate"] == 0.5
    # the decode step runs every layer and probes after layers 1..3
    assert row["speedup_model"] == pytest.approx(
        costs.step_ms / costs.token_ms(make_gate(cfg, L), L, L - 1, "propagate")
    )


# ---------------------------------------------------------------- the noise floors


def test_the_aa_range_is_its_least_then_its_greatest_ratio():
    """Broken: aa_min shows the greatest A/A speedup of a model's controls and aa_max the least."""
    from sweep.analysis import noise_floors

    rows = [aa_row("a", [[10.0]], [[5.0]]), aa_row("b", [[10.0]], [[20.0]]), aa_row("c", [[10.0]], [[10.0]])]
    floors = noise_floors(pl.DataFrame(rows, infer_schema_length=None)).row(0, named=True)
    assert (floors["aa_min"], floors["aa_median"], floors["aa_max"]) == pytest.approx((0.5, 1.0, 2.0))


def test_the_trials_own_floors_are_summed_up_by_their_median():
    """Broken: trial_floor_median is the mean of the trials' floors, which one noisy trial pulls up (0.04, not 0.02)."""
    from sweep.analysis import noise_floors

    rows = [
        aa_row(t, [[10.0]], [[10.0 + i]]) | {"noise_floor": f}
        for i, (t, f) in enumerate(zip("abc", (0.01, 0.02, 0.09)))
    ]
    floors = noise_floors(pl.DataFrame(rows, infer_schema_length=None)).row(0, named=True)
    assert floors["trial_floor_median"] == pytest.approx(0.02)


# ---------------------------------------------------------------- the profiles' summaries


def _trace(topk=(10, 10)) -> pl.DataFrame:
    """One model, one prompt, three decode positions over L=2 layers: layer 1 matches the final top-1 at the first
    position only; pca_delta at layer 1 is 0, 0 and 3."""
    rows = [
        {"model": "m", "run_id": "r", "prompt_id": "p", "position": pos, "phase": "decode", "layer": layer,
         "num_layers": 2, "top1_match": layer == 2 or pos == 0, "delta": 0.1, "pca_delta": [0.0, 0.0, 3.0][pos],
         "margin": 1.0, "cos_hidden": 0.5, "cos_logits": 0.5, "topk_overlap": 0.5, "topk": topk[pos % 2]}
        for pos in range(3) for layer in (1, 2)
    ]  # fmt: skip
    return pl.DataFrame(rows)


def test_the_layer_curves_pca_delta_is_a_median():
    """Broken: pca_delta_median is the mean, which one outlying step moves (1.0 where the median is 0)."""
    from sweep.analysis import layer_curve

    assert layer_curve(_trace())["pca_delta_median"].to_list() == [0.0, 0.0]


def test_the_profile_summary_counts_positions_and_gives_percentages():
    """Broken: `sweep profile`'s summary counts a row per position and layer as a position (6, not 3), and prints
    the oracle's share before L as a fraction under a percent sign (0.3%, not 33.3%)."""
    from sweep.analysis import format_summary

    text = format_summary(_trace(), 0.5)
    assert text.startswith("model m: L=2, 3 positions\n")
    assert "first match (the bound for any exit rule) mean layer 1.67 of 2, 33.3% before layer 2" in text


def test_eas_over_traces_of_different_topk_names_no_k():
    """Broken: EAS over traces taken at profile.topk 10 and 5 is labelled K=10, as if every overlap were a top-10's."""
    from sweep.analysis import eas_table

    assert eas_table(_trace(topk=(10, 5)), 0.5)["topk"].to_list() == [None] * 3


# ---------------------------------------------------------------- the screen


def test_the_screen_compares_only_measured_rows_that_are_ok():
    """Broken: a setting whose closed-loop trial failed is compared with its replay, its gap counted per gate."""
    from sweep.analysis import comparison

    measured = [{"trial_id": "t0", "status": "ok", "agreement": 0.8, "speedup_wall": 1.2},
                {"trial_id": "t1", "status": "failed", "agreement": 0.0, "speedup_wall": 0.1}]  # fmt: skip
    assert comparison(simulated_rows([True, True]), measured)["trial_id"].to_list() == ["t0"]


def test_the_screens_speedup_gap_is_simulated_minus_measured_and_its_mean():
    """Broken: the speedup gap is measured - simulated (a replay more optimistic than the bench reads negative), or
    its per-gate mean is a median."""
    from sweep.analysis import comparison, gap_by_gate

    measured = [
        {"trial_id": t, "status": "ok", "agreement": 0.9, "speedup_wall": s}
        for t, s in (("t0", 1.4), ("t1", 1.3), ("t2", 0.6))
    ]
    comp = comparison(simulated_rows([True, True, True]), measured)
    assert comp["speedup_gap"].to_list() == pytest.approx([0.1, 0.2, 0.9])
    assert gap_by_gate(comp)["speedup_gap_mean"].to_list() == pytest.approx([0.4])


def test_the_screens_line_counts_the_front_and_the_closed_loop_runs_apart():
    """Broken: the screen's line gives the settings run closed-loop as the front's and the front's as those run."""
    from sweep.report.run_report import screen_report

    sim = simulated_rows([True, False, False]).with_columns(on_front=pl.Series([True, True, False]))
    [line] = screen_report(SimpleNamespace(simulated=sim, rows=[]))
    assert line.startswith("screen: 3 settings simulated, 2 on the simulated front, 1 run closed-loop")


# ---------------------------------------------------------------- `sweep profile` and `sweep fit` on a tiny model


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """`sweep profile` of tiny-llama (vocabulary 260) at profile.topk=260, one prompt, 3 tokens: (root, trace)."""
    from sweep.trace.profile import run_profile

    root = tmp_path_factory.mktemp("profiled")
    cfg = compose("model=tiny-llama", "prompts=chat", "prompts.n=1", "profile.gen_tokens=3", "profile.topk=260",
                  f"results.root={root}")  # fmt: skip
    return root, run_profile(cfg)[1]


def test_a_profile_may_take_the_whole_vocabulary_as_its_topk(profiled):
    """Broken: profile.topk=260 on a 260-token vocabulary is refused, though the refusal says "at most 260"."""
    assert profiled[1]["topk"].unique().to_list() == [260]


def test_the_oracle_line_gives_the_skippable_share_in_percent(profiled):
    """Broken: a traced sweep's end prints the oracle's share of skippable layers as a fraction under a percent sign."""
    from sweep.report.run_report import oracle_lines

    root, trace = profiled
    decisions = trace.filter((pl.col("phase") == "decode") | (pl.col("position") == len(trace.filter(
        (pl.col("phase") == "prefill") & (pl.col("layer") == 1))) - 1))  # fmt: skip
    first = decisions.filter(pl.col("top1_match")).group_by("position").agg(pl.col("layer").min())["layer"]
    share = ((4 - first) / 4).mean()  # tiny-llama: L=4
    outcome = SimpleNamespace(root=root, simulated=pl.DataFrame({"trace_run_id": [trace["run_id"][0]]}))
    [line] = oracle_lines(outcome)
    assert line.startswith(f"tiny-llama: at best {100 * share:.1f}% of layers could be skipped at agreement 1.0")
    assert f"each of the trace's {len(first)} decisions" in line


def test_a_fit_on_exactly_as_many_positions_as_unknowns_says_nothing(tmp_path, caplog):
    """Broken: `sweep fit` warns that 65 positions are fewer than 65 unknowns per output (hidden 64 + 1), which they
    are not. One 58-token prompt and 9 tokens: 58 + 9 - 1 fed positions, the first left out."""
    from sweep.cli.commands import main

    with caplog.at_level(logging.WARNING, logger="sweep.trace.readouts"):
        code = main(["fit", "model=tiny-llama", "prompts=chat", "prompts.n=1", "fit.gen_tokens=9",
                     f"fit.out={tmp_path}"])  # fmt: skip
    assert code == 0
    assert not any("the translators were fitted on" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sweep.trace.readouts"):
        main(["fit", "model=tiny-llama", "prompts=chat", "prompts.n=1", "fit.gen_tokens=8", f"fit.out={tmp_path}"])
    assert any("fitted on 64 positions for 65 unknowns" in r.getMessage() for r in caplog.records)


def test_the_fit_reports_the_logit_lens_before_the_tuned_one():
    """Broken: `sweep fit`'s table shows the tuned lens's top-1 agreement under "top1 logit" and the logit lens's
    under "top1 tuned"."""
    from sweep.trace.fit import fit_report

    layer = {"layer": 1, "top1_logit": 0.25, "top1_tuned": 0.75, "kl_logit": 2.0, "kl_tuned": 0.5,
             "acc_logit": 0.9, "acc_tuned": 0.95}  # fmt: skip
    summary = {"model": "m", "prompts": 2, "prompt_set": "chat", "fit_seconds": 1.0, "translator_positions": 9,
               "decode_positions": 4, "layers": [layer]}  # fmt: skip
    assert (
        fit_report(summary).splitlines()[-1]
        == "    1       0.250       0.750      2.000      0.500      0.900      0.950"
    )


@pytest.fixture(scope="module")
def fitted():
    """`sweep fit` of tiny-llama on one prompt and 2 tokens at fit.ridge=1e6: (readouts, model, its states)."""
    from sweep.bench.session import process_session
    from sweep.decode.states import decode_states
    from sweep.trace.fit import fit, prepare

    cfg = compose("model=tiny-llama", "prompts=chat", "prompts.n=1", "fit.gen_tokens=2", "fit.ridge=1e6")
    prepared = prepare(cfg, process_session())
    lm, [prompt] = prepared[0], prepared[1]
    return fit(cfg, prepared), lm, decode_states(lm, prompt.input_ids, n_tokens=2), len(prompt.input_ids)


def test_the_translators_bias_is_not_shrunk_by_the_ridge(fitted):
    """Broken: fit.ridge penalises the translators' bias too (only D is pulled toward the identity), so at a large
    ridge the bias shrinks to 0 and the translated states are off by the mean of y - x. With b free, the residual of
    y - x = D x + b averages zero over the fitting positions (b's own normal equation)."""
    readouts, lm, decoded, _ = fitted
    hs = decoded.states

    def unit(h):
        h = h[0, 1:].double()  # every position but the first, as fitted
        return h / h.square().mean(-1, keepdim=True).sqrt()

    y = unit(hs[lm.num_layers])
    for layer in range(1, lm.num_layers):
        x = unit(hs[layer])
        d, b = readouts.weights["translator.weight"][layer - 1], readouts.weights["translator.bias"][layer - 1]
        residual = y - x - x @ d.double().T - b.double()
        assert residual.mean(0).abs().max().item() < 1e-4, layer
        assert (y - x).mean(0).abs().max().item() > 1e-2  # the mean a shrunk bias would leave


def test_the_fits_kl_is_the_mean_over_its_decision_positions(fitted):
    """Broken: the fit's table divides the summed KL(final || logit lens) by one more than the decision positions."""
    import json

    import torch.nn.functional as F

    readouts, lm, decoded, P = fitted
    hs, L = [h[0, P - 1 :].float() for h in decoded.states], lm.num_layers  # the decode positions: the first token's on
    final = F.log_softmax(lm.adapter.lens(hs[L]).float(), -1)
    for row in json.loads(readouts.meta["fit_summary"])["layers"]:
        lens = F.log_softmax(lm.adapter.lens(hs[row["layer"]]).float(), -1)
        kl = (final.exp() * (final - lens)).sum(-1).mean().item()
        assert row["kl_logit"] == pytest.approx(kl, abs=2e-6), row["layer"]


def test_a_refused_calibration_names_one_more_prompt_when_one_more_would_do(capsys):
    """Broken: 3 calibration prompts, one short of the 4 that certify at zero risk at delta 0.5 (HB's p-value there is
    0.5^n: 0.5^4 <= 0.1 < 0.5^3), are refused saying at least 5 are needed."""
    from sweep.cli.commands import main

    code = main(["calibrate", "model=tiny-llama", "gate=margin", "prompts=chat", "prompts.n=6", "calibrate.delta=0.5",
                 "bench.gen_tokens=2"])  # fmt: skip
    assert code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "3 calibration prompts (6 x calibrate.split=0.5) certify no threshold at calibrate.delta=0.5, "
            "calibrate.epsilon=0.1 with hb p-values, even at zero risk: at least 4 are needed"
        )
    )


def test_a_top1_overlap_of_the_final_layer_with_itself_is_whole(tmp_path):
    """Broken: at profile.topk=1 the top-K overlap is divided by 2 (the lens keeps at least two tokens), so the final
    layer overlaps itself by 0.5 and EAS's top-1 variant is halved."""
    from sweep.trace.profile import run_profile

    cfg = compose("model=tiny-llama", "prompts=chat", "prompts.n=1", "profile.gen_tokens=2", "profile.topk=1",
                  f"results.root={tmp_path}")  # fmt: skip
    trace = run_profile(cfg)[1]
    assert trace.filter(pl.col("layer") == 4)["topk_overlap"].unique().to_list() == [1.0]
    assert set(trace["topk_overlap"].to_list()) <= {0.0, 1.0}


def test_the_rounds_for_a_floor_target_follow_the_target_asked_for():
    """Broken: analysis.floor_target=0.05 is echoed in floor_target, but rounds_for_target is still the rounds a
    floor of 2% needs."""
    import numpy as np

    from sweep.analysis import noise_floors
    from sweep.bench.noise import rounds_for_floor

    base, aa = [[10.0]] * 4, [[9.0], [11.0], [10.5], [9.6]]
    floors = noise_floors(pl.DataFrame([aa_row("a", base, aa)]), target=0.05).row(0, named=True)
    want = rounds_for_floor(np.array(base), np.array(aa), 0.05, rounds=4)
    assert floors["floor_target"] == 0.05 and floors["rounds_for_target"] == want
    assert want != rounds_for_floor(np.array(base), np.array(aa), 0.02, rounds=4)
