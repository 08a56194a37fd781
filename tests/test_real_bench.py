"""The bench on the packaged real model (slow; `make test` runs it)."""

from __future__ import annotations

import pytest

from conftest import compose
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial

pytestmark = pytest.mark.slow

SMALL = ["model=smollm2-135m", "prompts.n=2", "bench.gen_tokens=16", "bench.repeats=1", "bench.warmup=0"]


def trial(*overrides):
    cfg = compose(*SMALL, *overrides)
    return run_trial(cfg, *prepare(cfg))


def test_full_gate_agrees_with_itself():
    row = trial("gate=full")
    assert row["status"] == "ok" and row["deterministic"]
    assert row["agreement"] == 1.0 and row["exact_match"] == 1.0
    assert row["speedup_model"] == pytest.approx(1.0)


def test_fixed_exit_really_skips_layers():
    row = trial("gate=fixed", "gate.exit_layer=15")
    assert row["status"] == "ok"
    assert row["exit_rate"] == 1.0 and row["mean_exit_layer"] == 15.0
    assert row["agreement"] < 1.0  # the skipping is real: the shallow lens picks other tokens
    assert row["speedup_model"] > 1.2 and row["speedup_wall"] > 1.2  # half the layers must show


def test_conformal_with_q_1_never_lies():
    row = trial("gate=conformal", "gate.q=1.0", "gate.min_layer=1")
    assert row["status"] == "ok"
    assert row["agreement"] == 1.0  # "miss, not lie" on the prompts it ran on


@pytest.mark.parametrize("overrides", [("gate=saturation", "gate.eps=0.3"), ("gate=margin", "gate.theta=8")])
def test_lossy_gates_produce_rows(overrides):
    row = trial(*overrides, "gate.min_layer=8")
    assert row["status"] == "ok" and 0.0 <= row["agreement"] <= 1.0
    assert row["probe_cost_layers"] > 0 and 8 <= row["mean_exit_layer"] <= 30


def test_self_speculation_is_lossless_on_the_real_model():
    row = trial("gate=fixed", "gate.exit_layer=15", "bench.mode=self_speculative", "bench.draft_len=3")
    assert row["status"] == "ok" and row["agreement"] == 1.0 and row["exact_match"] == 1.0
    assert 0 <= row["acceptance_rate"] <= 1
