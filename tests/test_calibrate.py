"""Learn-then-Test: p-values and fixed-sequence testing on synthetic losses with known
answers, the guarantee's validity by simulation, and `sweep calibrate` end to end."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from sweep.trace.calibrate import (
    binomial_cdf,
    certifiable_risk,
    fixed_sequence,
    hoeffding_bentkus_p,
    hoeffding_p,
    ordered,
    split,
)
from sweep.cli.commands import main


def test_hoeffding_p_values_by_hand():
    assert hoeffding_p(0.0, 400, 0.1) == pytest.approx(math.exp(-8))
    assert hoeffding_p(0.03, 400, 0.1) == pytest.approx(math.exp(-2 * 400 * 0.07**2))
    assert hoeffding_p(0.1, 400, 0.1) == 1.0 and hoeffding_p(0.2, 400, 0.1) == 1.0


def test_hoeffding_bentkus_by_hand_and_tighter():
    # zero observed loss on 82 prompts, delta 0.1: exp(-n h1(0, 0.1)) = 0.9^82; the Bentkus term is e * 0.9^82
    assert hoeffding_bentkus_p(0.0, 82, 0.1) == pytest.approx(0.9**82)
    for risk in (0.0, 0.02, 0.05, 0.08):
        assert hoeffding_bentkus_p(risk, 200, 0.1) <= hoeffding_p(risk, 200, 0.1)
    assert binomial_cdf(0, 10, 0.5) == pytest.approx(0.5**10) and binomial_cdf(10, 10, 0.3) == 1.0
    assert binomial_cdf(3, 10, 0.4) == pytest.approx(sum(math.comb(10, i) * 0.4**i * 0.6 ** (10 - i) for i in range(4)))


def test_fixed_sequence_known_answers():
    risks = [0.0, 0.01, 0.03, 0.08, 0.2]  # n = 400, delta = 0.1: p = 3e-4, 1.5e-3, 0.02, 0.73, 1
    pvalues = [hoeffding_p(r, 400, 0.1) for r in risks]
    assert fixed_sequence(pvalues, 0.05) == 2  # the most aggressive certified threshold
    assert fixed_sequence(pvalues, 0.01) == 1
    # testing stops at the first failure even if a later threshold would pass
    assert fixed_sequence([1e-4, 0.5, 1e-4], 0.05) == 0
    assert fixed_sequence([0.5, 1e-4], 0.05) == -1


def test_certifiable_risk_known_answers():
    # Hoeffding: exp(-2 n (delta - r)^2) = epsilon  =>  r = delta - sqrt(ln(1/epsilon) / 2n)
    assert certifiable_risk(400, 0.1, 0.05, hoeffding_p) == pytest.approx(0.1 - math.sqrt(math.log(20) / 800), abs=1e-9)
    # HB at zero loss is 0.9^n: 0.9^21 = 0.109 > 0.1 (nothing can be certified), 0.9^22 = 0.098
    assert certifiable_risk(21, 0.1, 0.1, hoeffding_bentkus_p) is None
    assert 0.0 <= certifiable_risk(22, 0.1, 0.1, hoeffding_bentkus_p) < 1e-3  # only (almost) zero loss passes
    bar = certifiable_risk(128, 0.1, 0.1, hoeffding_bentkus_p)
    assert hoeffding_bentkus_p(bar, 128, 0.1) <= 0.1 < hoeffding_bentkus_p(bar + 1e-6, 128, 0.1)


def test_the_guarantee_holds_by_simulation():
    """Bernoulli losses with known true risks; the third threshold's risk exceeds delta.
    Choosing it (or beyond) must happen with probability <= epsilon."""
    rng = np.random.default_rng(0)
    true = [0.02, 0.06, 0.12, 0.25]
    delta, epsilon, n, reps = 0.1, 0.1, 200, 2000
    bad = 0
    for _ in range(reps):
        risks = [rng.binomial(n, p) / n for p in true]
        chosen = fixed_sequence([hoeffding_bentkus_p(r, n, delta) for r in risks], epsilon)
        bad += chosen >= 2
    assert bad / reps <= epsilon


def test_thresholds_are_ordered_from_conservative_and_split_is_seeded():
    assert ordered("saturation", [0.3, 0.1, 0.2]) == [0.1, 0.2, 0.3]  # larger eps exits more
    assert ordered("margin", [8, 20, 14]) == [20, 14, 8]  # smaller theta exits more
    assert ordered("conformal", [0.5, 1.0]) == [1.0, 0.5]
    a, b = split(list(range(10)), 0.5, 3)
    assert sorted(a + b) == list(range(10)) and len(a) == 5 and split(list(range(10)), 0.5, 3) == (a, b)


def test_calibrate_command_on_a_tiny_model(capsys):
    code = main(
        [
            "calibrate",
            "model=tiny-qwen3",
            "model.tiny.init_std=0.02",
            "gate=margin",
            "gate.min_layer=1",
            "prompts.n=10",
            "bench.gen_tokens=6",
            "calibrate.delta=0.3",
            "calibrate.epsilon=0.3",
            "calibrate.grid='range(2.0, 0.0, step=-0.5)'",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "5 calibration and 5 held-out prompts" in out
    assert "with 5 calibration prompts a threshold is certified when its calibration risk is <= " in out
    assert "chosen theta=" in out and "held-out check: observed disagreement" in out


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["gate=full"], "gate=full: has no threshold to calibrate"),
        (["gate=margin", "calibrate.delta=0"], "calibrate.delta=0.0: must be a number in (0, 1)"),
        (
            ["gate=margin", "calibrate.delta=1"],
            "calibrate.delta=1.0: must be a number in (0, 1)",
        ),  # crashed in the p-value before
        (["gate=margin", "calibrate.split=1"], "calibrate.split=1.0: must be a number in (0, 1)"),
        (["gate=margin", "calibrate.pvalue=bonferroni"], "calibrate.pvalue=bonferroni: must be one of hb, hoeffding"),
        (["gate=margin", "gate.min_layer=1", "prompts.n=1"], "prompts.n: calibration needs at least 2 prompts"),
    ],
)
def test_bad_calibrate_input(overrides, message, capsys):
    assert main(["calibrate", "model=tiny-llama", *overrides]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["prompts.n=1"], "prompts.n: calibration needs at least 2 prompts"),
        (["prompts.n=2", "calibrate.heldout_prompts=chat"], "calibrate.heldout_prompts=chat: 2 of its prompts are"),
    ],
)
def test_what_the_prompt_sets_decide_is_refused_before_the_model_loads(overrides, message):
    """Both were found once the model had loaded (7 s and 21 s on SmolLM2): the sets' ids are read first."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys; import sweep.models as models; from sweep.cli.commands import main; "
        "code = main(sys.argv[1:]); print(json.dumps({'code': code, 'loads': models.model_loads()}))"
    )
    argv = ["calibrate", "model=tiny-llama", "gate=margin", "bench.gen_tokens=2", *overrides]
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"code": 2, "loads": 0} and message in out.stderr, out.stderr


def test_calibrate_reports_progress_on_long_loops(caplog, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # a CI runner's CI=true turns the display off
    caplog.set_level(logging.INFO, logger="sweep")
    code = main(
        [
            "calibrate",
            "model=tiny-llama",
            "gate=saturation",
            "gate.min_layer=2",
            "prompts=humaneval",
            "prompts.n=40",
            "bench.gen_tokens=2",
            "calibrate.delta=0.5",
            "calibrate.epsilon=0.5",
            "calibrate.grid='range(0.01, 0.03, step=0.01)'",
        ]
    )
    assert code == 0
    text = caplog.text
    assert "full-depth baselines: 40 prompts x 2 tokens" in text
    # in a pipe (pytest's stderr), each loop's first and last step, with elapsed time and ETA (sweep.progress)
    assert "calibrate: full-depth baselines: 1/40, " in text and "calibrate: full-depth baselines: 40/40, " in text
    assert "calibrate: eps=0.01: 20/20, 00:" in text  # the calibration half, threshold by threshold
    assert "[1/2] eps=0.01: calibration risk" in text  # the ladder, a line per threshold


def test_a_chosen_threshold_that_never_exits_is_said_to_certify_full_depth(capsys):
    """The classifier's default ladder starts at theta=1, which exits nowhere: its zero risk was certified and printed
    as "chosen theta=1: disagreement risk <= 0.1 ...", the exit rate 0.000 of the held-out line its only hint (a
    reader's). The table shows each threshold's exit rate, and a chosen one that never exits is said so."""
    code = main(
        ["calibrate", "model=tiny-qwen3", "model.tiny.init_std=0.02", "gate=margin", "gate.min_layer=1",
         "prompts.n=10", "bench.gen_tokens=6", "calibrate.delta=0.3", "calibrate.epsilon=0.3",
         "calibrate.grid='1000'"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    [row] = [line.split() for line in out.splitlines() if line.split()[:1] == ["1000"]]
    assert row == ["1000", "0.0000", "0.000", "0.168", "<-", "chosen"]  # risk, exit rate, 0.7**5
    said = " ".join(out.split())
    assert "chosen theta=1000: disagreement risk <= 0.3" in said
    assert "theta=1000 exits at no token of the calibration prompts: what it certifies is full depth's" in said


def test_a_calibration_that_can_certify_nothing_is_refused_before_it_decodes(capsys):
    """Whether any threshold can be certified hangs on the calibration prompts' count, delta and epsilon alone:
    `sweep calibrate` ran the baselines and its ladder (20 s on a tiny model, minutes on SmolLM2) and only then said
    none could be (a reader's). Now one line before any decoding, with how many prompts would do."""
    code = main(["calibrate", "model=tiny-llama", "gate=margin", "prompts=chat", "prompts.n=10", "bench.gen_tokens=2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "error: prompts.n: 5 calibration prompts (10 x calibrate.split=0.5) certify no threshold at "
        "calibrate.delta=0.1, calibrate.epsilon=0.1 with hb p-values, even at zero risk: at least 22 are needed"
    )  # 0.9**21 = 0.109 > 0.1 >= 0.9**22, as HB's p-value at zero risk is (1 - delta)**n
    assert "calibrate: ladder" not in err and "baseline" not in err


def test_a_fixed_exit_layer_certified_is_checked_on_the_held_out_prompts(capsys):
    """`sweep calibrate gate=fixed` stopped with "unexpected TypeError: 'float' object cannot be interpreted as an
    integer" once a layer was certified: the held-out check built the gate at exit_layer=3.0, the chosen value as the
    table keeps it, not the layer the ladder tested."""
    code = main(["calibrate", "model=tiny-llama", "gate=fixed", "prompts=chat", "prompts.n=10", "bench.gen_tokens=4",
                 "calibrate.delta=0.99", "calibrate.epsilon=0.5", "calibrate.grid='3,2,1'"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "chosen exit_layer=3: disagreement risk <= 0.99" in out and "held-out check: observed disagreement" in out
