"""Early exit in a batch: every sequence decides as it would alone; compute stops only when
all have exited."""

from __future__ import annotations

import pytest

from conftest import compose, load
from sweep.batching import BatchEngine, common_length
from sweep.bench import prepare, run_trial
from sweep.config import GateConfig
from sweep.engine import Engine
from sweep.errors import ConfigError
from sweep.gates import make_gate
from sweep.prompts import read_prompts, tokenize_prompts

GATES = [
    GateConfig(name="fixed", exit_layer=2),
    GateConfig(name="saturation", min_layer=2, eps=0.8),
    GateConfig(name="margin", min_layer=1, theta=0.4),
    GateConfig(name="conformal", min_layer=1, q=0.3),
    GateConfig(name="softmax", min_layer=1, theta=0.03, decay=4.0),
]


@pytest.fixture(scope="module")
def batch(tiny):
    cfg = compose("prompts=chat", "prompts.n=4").prompts
    return common_length([p.input_ids for p in tokenize_prompts(read_prompts(cfg), cfg, tiny.tokenizer)])


def test_common_length_keeps_each_prompts_end():
    assert common_length([[1, 2, 3, 4], [5, 6, 7]]) == [[2, 3, 4], [5, 6, 7]]


@pytest.mark.parametrize("policy", ["propagate", "full"])
@pytest.mark.parametrize("gate_cfg", GATES, ids=[g.name for g in GATES])
def test_each_sequence_decides_as_it_would_alone(tiny, batch, gate_cfg, policy):
    L = tiny.num_layers
    together = BatchEngine(tiny, make_gate(gate_cfg, L), policy).generate_batch(batch, 8)
    alone = [Engine(tiny, make_gate(gate_cfg, L), policy).generate(ids, 8) for ids in batch]
    assert together.tokens == [g.tokens for g in alone]
    assert together.exit_layers == [g.exit_layers for g in alone]
    # the max-over-batch rule: a step runs to the deepest sequence's exit (L under kv_policy=full)
    for step, ran in enumerate(together.step_layers, start=1):
        deepest = max(row[step] for row in together.exit_layers)
        assert ran == (L if policy == "full" else deepest)


def test_full_depth_batch_equals_single_sequences(tiny, batch):
    assert BatchEngine(tiny).generate_batch(batch, 8).tokens == [Engine(tiny).generate(ids, 8).tokens for ids in batch]


def test_batched_bench_rows(tmp_path):
    rows = {}
    for size in (1, 2, 4):
        cfg = compose("model=tiny-llama", "gate=fixed", "gate.exit_layer=2", f"bench.batch_size={size}", "prompts.n=4",
                      "bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0")
        rows[size] = run_trial(cfg, *prepare(cfg))
    for size, row in rows.items():
        assert row["status"] == "ok" and row["batch_size"] == size and row["n_prompts"] == 4
        assert row["step_layers_saved"] == pytest.approx(0.5)  # every sequence exits at 2 of 4
    saturation = compose("model=tiny-llama", "gate=saturation", "gate.eps=0.8", "gate.min_layer=2", "bench.batch_size=4",
                         "prompts.n=4", "bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0")
    row = run_trial(saturation, *prepare(saturation))
    assert row["step_layers_saved"] <= row["layers_saved"] + 1e-9  # a batch saves at most what its sequences do


def test_a_batch_needs_enough_prompts():
    cfg = compose("model=tiny-llama", "gate=fixed", "gate.exit_layer=2", "bench.batch_size=8", "prompts.n=4", "bench.gen_tokens=4")
    with pytest.raises(ConfigError, match="bench.batch_size=8: needs at least 8 prompts"):
        run_trial(cfg, *prepare(cfg))


def test_partly_exited_steps_pay_a_second_head_in_the_cost_model():
    """A step where some sequences exited but the batch ran on to L computes the model's head
    for the batch and the exited rows' own lens: the cost model charges both."""
    from sweep.costs import cost_model

    tiny = load("model=tiny-llama")
    cfg = compose("prompts=chat", "prompts.n=4").prompts
    batch = common_length([p.input_ids for p in tokenize_prompts(read_prompts(cfg), cfg, tiny.tokenizer)])
    L = tiny.num_layers
    gate = make_gate(GateConfig(name="saturation", min_layer=2, eps=0.5), L)  # some sequences exit, some run to L
    gen = BatchEngine(tiny, gate, "propagate").generate_batch(batch, 8)
    partial = [int(ran == L and any(row[step] < L for row in gen.exit_layers)) for step, ran in enumerate(gen.step_layers, start=1)]
    assert gen.extra_heads == partial and any(partial), "the fixture should have partly exited steps"
    early = [ran - min([row[step] for row in gen.exit_layers if row[step] < ran], default=ran) for step, ran in enumerate(gen.step_layers, start=1)]
    assert gen.extra_fill_layers == early
    costs = cost_model(tiny, batch[0], gates=[gate])
    plain = costs.speedup(gate, gen.step_layers, gen.probes, "propagate")
    charged = costs.speedup(gate, gen.step_layers, gen.probes, "propagate", gen.extra_heads, gen.extra_fill_layers)
    assert charged < plain
    gated = sum(costs.token_ms(gate, e, p, "propagate") for e, p in zip(gen.step_layers, gen.probes))
    extra = sum(partial) * costs.head_ms + sum(early) * costs.fill_ms("propagate")
    assert charged == pytest.approx(len(gen.step_layers) * costs.step_ms / (gated + extra))
    # a fixed gate exits every sequence at once: nothing extra
    fixed = BatchEngine(tiny, make_gate(GateConfig(name="fixed", exit_layer=2), L), "propagate").generate_batch(batch, 8)
    assert set(fixed.extra_heads) == {0} and set(fixed.extra_fill_layers) == {0}
