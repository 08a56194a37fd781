"""Record once, evaluate many: a gate replayed on a profile trace decides exactly as the
closed-loop engine does (kv_policy=full) until the first divergence, on every tiny family."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from conftest import compose, load
from sweep.config import GateConfig
from sweep.costs import CostModel
from sweep.engine import Engine
from sweep.gates import GATES, make_gate
from sweep.profile import profile_prompts
from sweep.prompts import read_prompts, tokenize_prompts
from sweep.simulate import exit_layers, probes_at, signals_from_trace, simulate, threshold_value

N = 8
SETTINGS = {
    "full": [GateConfig(name="full", min_layer=1)],
    "fixed": [GateConfig(name="fixed", min_layer=1, exit_layer=e) for e in (1, 2, 3, 4)] + [GateConfig(name="fixed", min_depth=0.5)],
    "saturation": [GateConfig(name="saturation", min_layer=m, eps=e) for m in (1, 2) for e in (0.55, 0.75, 0.95)],
    "margin": [GateConfig(name="margin", min_layer=m, theta=t) for m in (1, 3) for t in (0.25, 0.45, 1.5)],
    "conformal": [GateConfig(name="conformal", min_layer=1, q=q) for q in (0.05, 0.5, 1.0)],
    "softmax": [GateConfig(name="softmax", min_layer=1, theta=t, decay=d) for t in (0.02, 0.05, 0.3) for d in (None, 4.0)],
    "cosine": [GateConfig(name="cosine", min_layer=2, eps=e, decay=d) for e in (0.1, 0.2, 0.4) for d in (None, 2.0)],
    "entropy": [GateConfig(name="entropy", min_layer=1, theta=t) for t in (3.5, 4.3, 5.0)],
    "pca": [GateConfig(name="pca", min_layer=2, eps=e, k=8) for e in (0.5, 0.7, 0.9)],
}


def test_every_gate_is_simulated():
    assert set(SETTINGS) == set(GATES.names())


@pytest.fixture(scope="module")
def traced(tiny):
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    prompts = tokenize_prompts(read_prompts(cfg), cfg, tiny.tokenizer)
    trace = profile_prompts(tiny, prompts, N, topk=3, pca_k=8).with_columns(
        model=pl.lit(tiny.name), run_id=pl.lit("r"), num_layers=pl.lit(tiny.num_layers)
    )
    return prompts, signals_from_trace(trace)


def test_signals_cover_every_generated_token(tiny, traced):
    prompts, sig = traced
    assert sig.positions == len(prompts) * N and sig.num_layers == tiny.num_layers
    assert sig.token_index.tolist() == list(range(N)) * len(prompts)
    lengths = {p.id: len(p.input_ids) for p in prompts}
    assert [r.shape[0] for r in sig.prefill_residual] == [lengths[p] for p in sig.prompt_ids]


@pytest.mark.parametrize("gate_name", sorted(SETTINGS))
def test_simulation_equals_the_closed_loop_until_the_first_divergence(tiny, traced, gate_name):
    prompts, sig = traced
    L = tiny.num_layers
    order = {p: i for i, p in enumerate(sig.prompt_ids)}
    baseline = {p.id: Engine(tiny).generate(p.input_ids, N).tokens for p in prompts}
    compared = 0
    for cfg in SETTINGS[gate_name]:
        gate = make_gate(cfg, L)
        sim = exit_layers(type(gate), sig, torch.tensor([threshold_value(gate)]), 1 if gate_name == "fixed" else gate.min_layer, cfg.decay)[0]
        for prompt in prompts:
            gen = Engine(tiny, gate, "full").generate(prompt.input_ids, N)
            rows = (sig.prompt_index == order[prompt.id]).nonzero().flatten()
            diverged = next((i for i, (a, b) in enumerate(zip(gen.tokens, baseline[prompt.id])) if a != b), N - 1)
            for i in range(diverged + 1):  # decided on the same context as the trace
                t = rows[i]
                assert gen.exit_layers[i] == int(sim[t]), (cfg, prompt.id, i)
                agrees = gen.tokens[i] == baseline[prompt.id][i]
                assert agrees == bool(sig.match[t, sim[t] - 1]), (cfg, prompt.id, i)
                compared += 1
    assert compared >= len(SETTINGS[gate_name]) * len(prompts)


def test_simulate_rows_and_predicted_speedup(traced, tiny):
    _, sig = traced
    L = tiny.num_layers
    costs = CostModel(layer_ms=1.0, head_ms=2.0, lens_probe_ms=2.2, hidden_probe_ms=0.05, kv_ms=0.1, overhead_ms=0.5, step_ms=L + 2.5,
                      num_layers=L, extra_probe_ms={"pca:8": 0.3})
    cfgs = [c for group in SETTINGS.values() for c in group]
    table = simulate(cfgs, sig, costs)
    assert table.height == len(cfgs)
    full = table.filter(pl.col("gate") == "full").row(0, named=True)
    assert full["agreement_tf"] == 1.0 and full["exit_rate"] == 0.0 and full["speedup_model"] == pytest.approx(1.0)
    fixed = table.filter((pl.col("gate") == "fixed") & (pl.col("exit_layer") == 2)).row(0, named=True)
    assert fixed["exit_rate"] == 1.0 and fixed["mean_exit_layer"] == 2.0
    expected = costs.step_ms / costs.token_ms(make_gate(cfgs[2], L), 2, 1, "propagate")  # exit at 2 after one probe, every step
    assert fixed["speedup_model"] == pytest.approx(expected)
    assert table["agreement_tf"].is_between(0, 1).all()


def test_a_pca_replay_needs_the_traces_k(traced):
    from sweep.errors import ConfigError

    _, sig = traced
    with pytest.raises(ConfigError, match="gate.k=16: the trace's pca signal has k=8"):
        simulate([GateConfig(name="pca", eps=0.5, k=16, min_layer=1)], sig, None)


def test_old_traces_without_new_signals_say_so(traced):
    from dataclasses import replace

    from sweep.errors import ConfigError

    _, sig = traced
    with pytest.raises(ConfigError, match="no 'entropy' column"):
        simulate([GateConfig(name="entropy", theta=1.0, min_layer=1)], replace(sig, extra={}), None)


def test_probe_counts_follow_the_engine():
    margin = make_gate(GateConfig(name="margin", min_layer=3, theta=1.0), 10)
    assert probes_at(margin, torch.tensor([3, 5, 10])).tolist() == [1, 3, 7]  # layers 3..9 are probed
    fixed = make_gate(GateConfig(name="fixed", exit_layer=4), 10)
    assert probes_at(fixed, torch.tensor([4])).tolist() == [1]
    assert probes_at(make_gate(GateConfig(name="full"), 10), torch.tensor([10])).tolist() == [0]


def test_costs_on_tensors_equal_costs_on_numbers():
    costs = CostModel(1.0, 3.0, 3.5, 0.1, 0.1, 1.0, 14.0, 10)
    for name, cfg in [("margin", GateConfig(name="margin", theta=1.0)), ("saturation", GateConfig(name="saturation", eps=0.1))]:
        gate = make_gate(cfg, 10)
        for policy in ("propagate", "full"):
            exits = torch.tensor([3.0, 10.0])
            probes = torch.tensor([3.0, 9.0])
            tensor = costs.token_ms(gate, exits, probes, policy)
            assert tensor.tolist() == pytest.approx([costs.token_ms(gate, 3, 3, policy), costs.token_ms(gate, 10, 9, policy)])
