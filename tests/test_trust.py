"""Figures a user reads, checked against independent computations: layers saved on decode
steps, end-to-end speedups (wall clock and cost model) for every gate."""

from __future__ import annotations

import math
import statistics

import pytest

from conftest import compose
from helpers.factories import cost_model
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial
from sweep.bench.estimators import Timings
from sweep.bench.metrics import PromptRun as _PromptRun
from sweep.bench.metrics import metrics as _metrics
from sweep.bench.costs import CostModel, DecodeSteps
from sweep.decode.engine import Generation
from sweep.gates import make_gate
from sweep.models.prompts import Prompt

L = 4


def costs(**kw) -> CostModel:
    return cost_model(L, **kw)


def gate(name, **kw):
    from sweep.config import GateConfig

    return make_gate(GateConfig(name=name, **kw), L)


def test_layers_saved_counts_decode_steps_only():
    # the first token exits at layer 2 (decided on the prefill: it saves nothing); every decode step runs all 4 layers
    run = _PromptRun(
        Prompt("p", "text", (1, 2, 3)),
        Generation([5, 6, 7], [L, L, L], [0, 0, 0], 0.0),
        Generation([5, 6, 7], [2, L, L], [1, 2, 2], 0.0),
    )
    t = Timings([[1.0]], [[1.0]], [[0.1]], [[0.1]])
    row = _metrics([run], t, costs(), gate("saturation", eps=0.1, min_layer=2), "propagate", L)
    assert row["layers_saved"] == 0.0  # before: 1 - (2 + 4 + 4) / 3 / 4 = 0.167
    assert row["exit_rate"] == pytest.approx(1 / 3)  # the documented count still includes the first token


def test_end_to_end_cost_model_in_closed_form():
    c = costs()
    conformal = gate("conformal", q=1.0, min_layer=2)  # probes after layers 2 and 3
    # calibration: a lens over every prompt position at layers 2, 3 and L: 3 passes x 5 ms x (20 / 10 tokens)
    assert c.calibration_ms(conformal, 20) == pytest.approx(30.0)
    assert c.calibration_ms(gate("margin", theta=1.0, min_layer=2), 20) == 0.0
    # two decode steps, both exit at layer 2 after one probe: overhead 0.5 + 2 layers + probe 2.5 + 2 K/V fills 0.4
    step = 0.5 + 2 * 1.0 + 2.5 + 2 * 0.2
    decode_only = 2 * 6.5 / (2 * step)
    assert c.speedup(conformal, DecodeSteps([2, 2], [1, 1]), "propagate") == pytest.approx(decode_only)
    prefill = 100.0 * 20 / 10
    e2e = (prefill + 2 * 6.5) / (prefill + 30.0 + 2 * step)
    assert c.speedup_e2e(conformal, DecodeSteps([2, 2], [1, 1]), "propagate", [20]) == pytest.approx(e2e)
    assert e2e < decode_only  # the prefill dilutes the saving and calibration costs extra


def median_ratio(base, gated):
    return statistics.median(sum(b) / sum(g) for b, g in zip(base, gated))


@pytest.mark.parametrize(
    "name,params",
    [
        ("full", []),
        ("fixed", ["gate.exit_layer=2"]),
        ("saturation", ["gate.eps=0.9", "gate.min_layer=2"]),
        ("margin", ["gate.theta=0.1", "gate.min_layer=1"]),
        ("conformal", ["gate.q=0.5", "gate.min_layer=2"]),
    ],
)
def test_every_gate_reports_end_to_end_speedups(tmp_path, name, params):
    cfg = compose(
        "model=tiny-llama",
        f"results.root={tmp_path}",
        "bench.gen_tokens=5",
        "bench.repeats=3",
        "bench.warmup=0",
        "prompts.n=2",
        f"gate={name}",
        *params,
    )
    lm, g, prompts = prepare(cfg)
    row = run_trial(cfg, lm, g, prompts)
    assert row["status"] == "ok"
    base, gated = row["round_baseline_ms"], row["round_ms"]
    assert len(base) == 3 and len(base[0]) == 2
    # the reported figures, recomputed from the stored timings by another path
    assert row["speedup_wall"] == pytest.approx(median_ratio(base, gated))
    add = lambda a, b: [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]  # noqa: E731
    assert row["speedup_e2e_wall"] == pytest.approx(
        median_ratio(add(base, row["round_baseline_prefill_ms"]), add(gated, row["round_prefill_ms"]))
    )
    assert row["speedup_e2e_model"] is not None and row["speedup_e2e_model"] > 0
    assert row["prompt_input_tokens"] == [len(p.input_ids) for p in prompts]
    if name == "conformal":
        assert row["cost_calibration_ms"] > 0 and row["calibration_ms"] > 0
    else:
        assert row["cost_calibration_ms"] == 0.0


def test_analysis_can_rank_by_the_end_to_end_speedup(tmp_path, capsys):
    from sweep.cli.commands import main
    from sweep.store import read

    common = [
        "model=tiny-llama",
        "prompts.n=2",
        "bench.gen_tokens=5",
        "bench.repeats=2",
        "bench.warmup=0",
        f"results.root={tmp_path}",
    ]
    for gate in (
        ["gate=full"],
        ["gate=fixed", "gate.exit_layer=2"],
        ["gate=fixed", "gate.exit_layer=3"],
        ["gate=conformal", "gate.q=1.0", "gate.min_layer=2"],
    ):
        assert main(["bench", *common, *gate]) == 0
    assert main(["analyze", f"results.root={tmp_path}", "analysis.speedup=speedup_e2e_wall"]) == 0
    pareto = read("pareto", tmp_path)
    assert set(pareto["speedup_metric"]) == {"speedup_e2e_wall"}
    for r in pareto.iter_rows(named=True):
        if r["trial_id"] == "full-depth":
            assert r["speedup"] == r["speedup_lo"] == r["speedup_hi"] == 1.0
            continue
        capped = r["speedup_e2e_wall"] if r["skipped_compute"] else min(r["speedup_e2e_wall"], 1.0)
        inside = abs(math.log(capped)) <= math.log1p(r["noise_floor_e2e"])  # the e2e metric's own A/A floor
        assert r["speedup_floor"] == r["noise_floor_e2e"] and r["speedup"] == (1.0 if inside else capped)
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Speedups rank by `speedup_e2e_wall`" in report
    capsys.readouterr()
    assert main(["analyze", f"results.root={tmp_path}", "analysis.speedup=speedup_model"]) == 2
    assert "analysis.speedup=speedup_model: must be one of speedup_wall, speedup_e2e_wall" in capsys.readouterr().err
