"""The bench: determinism self-check against real nondeterminism, metrics, rows, errors."""

from __future__ import annotations

import contextlib
import math

import pytest

from conftest import compose, run_cli
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial
from sweep.config.identity import trial_columns
from sweep.cli.commands import main
from sweep.bench.costs import CostModel, DecodeSteps
from sweep.gates import make_gate
from sweep.store import read

FAST = ["bench.gen_tokens=6", "bench.repeats=2", "bench.warmup=0", "prompts.n=2"]


def bench_cfg(tmp_path, *overrides):
    return compose("model=tiny-llama", f"results.root={tmp_path}", *FAST, *overrides)


@contextlib.contextmanager
def stateful_layer(lm, *, after_calls: int = 0, scale: float = 0.5):
    """Make layer 1 keep state across calls: its output moves with every call it has seen
    (like a cache that survives a reset), by a bounded offset that never settles however many
    calls came first (the cost model's measurements). A real nondeterminism between generations."""
    calls = {"n": 0}

    def drift(_module, _args, output):
        calls["n"] += 1
        if calls["n"] > after_calls:
            return output + scale * math.sin(calls["n"])

    handle = lm.adapter.layers[0].register_forward_hook(drift)
    try:
        yield calls
    finally:
        handle.remove()


def test_determinism_self_check_catches_a_stateful_layer(tmp_path):
    cfg = bench_cfg(tmp_path)
    lm, gate, prompts = prepare(cfg)
    with stateful_layer(lm):
        row = run_trial(cfg, lm, gate, prompts)
    assert row["status"] == "nondeterministic" and row["deterministic"] is False
    assert row["determinism_max_logit_diff"] > 0
    clean = run_trial(cfg, lm, gate, prompts)  # the same model without the state is fine again
    assert clean["status"] == "ok" and clean["deterministic"] and clean["determinism_max_logit_diff"] == 0.0


def test_a_timed_repeat_that_drifts_is_caught_too(tmp_path):
    cfg = bench_cfg(tmp_path, "prompts.n=1")
    lm, gate, prompts = prepare(cfg)
    reference_calls = 3 * 6  # two baselines and one gated run of 6 steps each (gate=full runs every layer)
    with stateful_layer(lm, after_calls=reference_calls):
        row = run_trial(cfg, lm, gate, prompts)
    assert row["determinism_max_logit_diff"] == 0.0  # the two baselines agreed...
    assert row["status"] == "nondeterministic"  # ...but a timed repeat did not reproduce its tokens


def test_full_gate_is_its_own_baseline(tmp_path):
    cfg = bench_cfg(tmp_path, "gate=full")
    row = run_trial(cfg, *prepare(cfg))
    assert row["status"] == "ok"
    assert row["agreement"] == row["prefix_agreement"] == row["exact_match"] == 1.0
    assert row["exit_rate"] == 0.0 and row["mean_exit_layer"] == 4 and row["layers_saved"] == 0.0
    assert row["speedup_model"] == pytest.approx(1.0)
    assert row["probe_cost_layers"] == 0.0 and row["speedup_wall"] > 0


def test_fixed_gate_metrics(tmp_path):
    cfg = bench_cfg(tmp_path, "gate=fixed", "gate.exit_layer=2")
    row = run_trial(cfg, *prepare(cfg))
    assert row["exit_rate"] == 1.0 and row["mean_exit_layer"] == 2.0 and row["layers_saved"] == 0.5
    assert row["exit_layer"] == 2 and row["eps"] is None and row["theta"] is None and row["q"] is None
    assert len(row["prompt_agreement"]) == len(row["prompt_ids"]) == 2 == len(row["prompt_speedup_wall"])
    assert row["agreement"] == pytest.approx(sum(row["prompt_agreement"]) / 2)
    assert 0 <= row["prefix_agreement"] <= row["agreement"] <= 1
    assert row["speedup_model"] > 1.0  # skipping half the layers is predicted to pay


def test_bench_writes_one_row_with_the_schema(tmp_path, capsys):
    code = main(
        [
            "bench",
            "model=tiny-qwen2",
            "gate=margin",
            "gate.theta=0.4",
            "gate.min_layer=1",
            f"results.root={tmp_path}",
            *FAST,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "status: ok" in out and "speedup_wall" in out
    df = read("trials", tmp_path)
    assert df.height == 1
    row = df.row(0, named=True)
    assert row["gate"] == "margin" and row["theta"] == 0.4 and row["status"] == "ok" and row["model"] == "tiny-qwen2"
    assert row["probe_cost_layers"] > 0 and row["schema_version"] >= 1
    assert (tmp_path / "trials" / "model=tiny-qwen2" / "gate=margin" / f"{row['trial_id']}.parquet").is_file()


def test_trial_id_is_a_stable_hash_of_the_trial_config(tmp_path):
    def trial_id(cfg):
        return trial_columns(cfg)["trial_id"]

    a = trial_id(bench_cfg(tmp_path, "gate=saturation", "gate.eps=0.2"))
    assert a == trial_id(bench_cfg(tmp_path / "elsewhere", "gate=saturation", "gate.eps=0.2", "run_id=other"))
    assert a != trial_id(bench_cfg(tmp_path, "gate=saturation", "gate.eps=0.3"))
    assert a != trial_id(bench_cfg(tmp_path, "gate=saturation", "gate.eps=0.2", "bench.kv_policy=full"))
    assert len(a) == 16 and int(a, 16) >= 0


def test_cost_model_flag_prints_the_table(tmp_path, capsys):
    assert main(["bench", "model=tiny-llama", "bench.cost_model=true", f"results.root={tmp_path}", *FAST]) == 0
    out = capsys.readouterr().out
    assert "K/V fill, one layer (propagate)" in out and "final norm + lm_head" in out


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["gate=fixed", "gate.exit_layer=9"], "gate.exit_layer=9: must be in 1..4"),
        (["gate=fixed", "gate.exit_layer=2", "gate.min_layer=3"], "gate.exit_layer=2: must be in 3..4"),
        (["gate=margin", "gate.min_layer=5"], "gate.min_layer=5: must be in 1..4"),
        (["gate=saturation", "gate.eps=0"], "gate.eps=0: must be a number > 0 (finite) for gate=saturation"),
        (["gate=conformal", "gate.q=2"], "gate.q=2: must be a number in (0, 1] for gate=conformal"),
        (["bench.kv_policy=none"], "bench.kv_policy=none: must be one of propagate, full"),
        (["bench.repeats=0"], "bench.repeats=0: must be an integer in 1..1000"),
        (["bench.gen_tokens=1"], "bench.gen_tokens=1: must be an integer in 2..4096"),
    ],
)
def test_bad_bench_input_exits_2_and_writes_nothing(tmp_path, capsys, overrides, message):
    code = main(["bench", "model=tiny-llama", f"results.root={tmp_path / 'r'}", *FAST, *overrides])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0]
    assert not (tmp_path / "r").exists()


def test_a_trial_that_raises_is_a_failed_row(tmp_path, capsys, monkeypatch):
    from sweep.decode.engine import Engine

    def broken(*_args, **_kwargs):
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line")

    monkeypatch.setattr(Engine, "generate", broken)  # the first decode of the trial raises
    code = main(["bench", "model=tiny-llama", f"results.root={tmp_path}", *FAST])
    out = capsys.readouterr().out
    assert code == 1 and "status: failed" in out
    row = read("trials", tmp_path).row(0, named=True)
    assert row["status"] == "failed" and row["error"] == "RuntimeError: CUDA error: an illegal memory access"
    assert row["agreement"] is None and row["speedup_wall"] is None and row["gate"] == "full"


def test_cost_model_arithmetic():
    costs = CostModel(
        layer_ms=1.0,
        head_ms=3.0,
        lens_probe_ms=3.5,
        hidden_probe_ms=0.1,
        kv_ms=0.1,
        overhead_ms=1.0,
        step_ms=14.0,
        num_layers=10,
    )
    from sweep.config import GateConfig

    margin = make_gate(GateConfig(name="margin", min_layer=1, theta=1.0), 10)
    sat = make_gate(GateConfig(name="saturation", min_layer=1, eps=0.1), 10)
    fixed = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=5), 10)
    # exit at 5 after 5 lens probes: overhead + 5 layers + 5 probes + 5 K/V fills; the probe's logits are the token's
    assert costs.token_ms(margin, 5, 5, "propagate") == pytest.approx(1 + 5 + 17.5 + 0.5)
    # a saturation exit pays the head for its token; kv_policy=full also runs the skipped layers
    # and the model's own final norm + lm_head
    assert costs.token_ms(sat, 5, 5, "full") == pytest.approx(1 + 5 + 0.5 + 5 + 3 + 3)
    assert costs.token_ms(sat, 5, 5, "propagate") == pytest.approx(1 + 5 + 0.5 + 0.5 + 3)
    # no exit: full depth plus every probe
    assert costs.token_ms(sat, 10, 9, "propagate") == pytest.approx(1 + 10 + 0.9 + 3)
    assert costs.speedup(fixed, DecodeSteps([5, 5], [1, 1]), "propagate") == pytest.approx(14 / (1 + 5 + 0.5 + 3))
    assert costs.layers(3.0) == 3.0


def test_measured_cost_model_is_sane():
    from conftest import load
    from sweep.bench.costs import cost_model

    lm = load("model=tiny-mistral")
    costs = cost_model(lm, list(range(1, 30)))
    assert costs.num_layers == 4
    for value in (
        costs.layer_ms,
        costs.head_ms,
        costs.lens_probe_ms,
        costs.hidden_probe_ms,
        costs.kv_ms,
        costs.step_ms,
    ):
        assert value > 0
    assert cost_model(lm, list(range(2, 31))) is costs  # measured once per process and prompt length
    assert cost_model(lm, [1, 2, 3]) is not costs


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_bench_console_script(tmp_path):
    res = run_cli(
        "bench",
        "model=tiny-gemma3",
        "gate=saturation",
        "gate.eps=0.7",
        "gate.min_layer=2",
        f"results.root={tmp_path}",
        *FAST,
    )
    assert res.returncode == 0, res.stderr
    assert "determinism: ok" in res.stdout and "row: " in res.stdout
    assert read("trials", tmp_path)["gate"].to_list() == ["saturation"]


def test_bench_rows_name_their_own_reference(tmp_path):
    """`sweep bench` takes its own reference and self-check (no reuse): the row says so."""
    assert main(["bench", "model=tiny-llama", f"results.root={tmp_path}", *FAST]) == 0
    row = read("trials", tmp_path).row(0, named=True)
    assert row["reference_reused"] is False and row["reference_id"].count("-") == 2
    assert row["status"] == "ok"
