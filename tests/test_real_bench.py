"""The bench on the packaged real model (slow; `make test` runs it)."""

from __future__ import annotations

import pytest

from conftest import compose, load
from helpers.contract import chat_prompts
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial
from sweep.gates.skipset import SkipSet
from sweep.decode.engine import Engine
from sweep.decode.skipscreen import first_drafts, record
from sweep.decode.speculative import SelfSpeculative, SkipDraft

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
    row = trial("gate=conformal", "gate.q=1.0", "gate.min_layer=1", "bench.gen_tokens=8")
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


SKIPS = ["none", "m2+a4-5+m4-5+a7+m8+a10-11+m14+m22+m24-25+a27-29", "a3-6+m3+m5-6+a9-13+m11+a15+m16-17+a21+m21+a26"]


# the full model drafting for itself, and a set (the screen's test below runs both sets closed loop)
@pytest.mark.parametrize("skip", SKIPS[:2])
def test_skip_set_self_speculation_is_lossless_on_the_real_model(skip):
    row = trial("gate=skip", f"gate.skip={skip}", "bench.mode=self_speculative", "bench.draft_len=4")
    assert row["status"] == "ok" and row["agreement"] == 1.0 and row["exact_match"] == 1.0
    assert row["skip"] == skip and row["skip_ratio"] == pytest.approx(len(SkipSet.parse(skip)) / 60)
    assert row["acceptance_length"] == pytest.approx(1 + row["mean_accepted_length"])
    if skip == "none":  # the full model drafting for itself: every draft accepted
        assert row["acceptance_rate"] == 1.0 and row["acceptance_length"] == pytest.approx(5.0, abs=0.6)
    else:
        assert 0 <= row["acceptance_rate"] < 1


def test_the_screen_predicts_each_rounds_first_draft_on_the_real_model():
    """SmolLM2's screen (one batched forward per set) against its closed loop, round by round."""
    lm = load("model=smollm2-135m")
    prompts = [p.input_ids for p in chat_prompts(lm, 2)]
    rec = record(lm, prompts, 16)
    rounds = 0
    for text in SKIPS[1:]:
        skip = SkipSet.parse(text)
        screen = first_drafts(lm, rec, skip)
        for i, ids in enumerate(prompts):
            gen = SelfSpeculative(lm, SkipDraft(lm, skip), 4).generate(ids, 16)
            assert gen.tokens == rec.tokens[i] == Engine(lm).generate(ids, 16).tokens
            for start, accepted in zip(gen.round_starts, gen.accepted_lengths):
                assert bool(screen.match[i][start - 1]) == (accepted >= 1), (text, i, start)
                rounds += 1
    assert rounds >= 10
