"""Record once, evaluate many: a gate replayed on a profile trace decides exactly as the
closed-loop engine does (kv_policy=full) until the first divergence, on every tiny family,
in float32 and in bfloat16."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
import torch

from conftest import TINY_FAMILIES, compose, load
from helpers.contract import base_setting, decided_settings, replay_equals_engine
from sweep.config import GateConfig
from sweep.bench.costs import CostModel
from sweep.decode.engine import Engine
from sweep.gates import GATES, Decoding, make_gate
from sweep.decode.states import decode_states
from sweep.trace.profile import profile_prompts, trace_prompt
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.trace.simulate import Signals, probes_at, signals_from_trace, simulate, threshold_value

N = 8
DTYPES = ("float32", "bfloat16")
# The conformal certificate never fires on the default tiny models (their lens residual dwarfs
# their margins, like the post-mortem's real models). At these init scales each family's lens
# converges enough that it fires at some positions and settings and not at others (Gemma3's
# post-norms make its layers' updates O(1), so there a larger embedding is what converges).
CONVERGING = {"gemma3": 0.5, "llama": 0.02, "mistral": 0.02, "qwen2": 0.017, "qwen3": 0.02}
# every registered gate but those that read fitted readouts (tests/test_learned_exits.py replays the classifier
# on a trace taken with readouts)
NAMES = sorted(spec.name for spec in GATES if not spec.readouts)


def settings_of(name: str, sig, num_layers: int) -> list[GateConfig]:
    """Settings of gate ``name`` found on the trace itself (helpers.contract.decided_settings): thresholds at
    exit fractions 0.2, 0.5 and 0.8, and, for a gate that takes CALM's decay, the same with decay=4."""
    found = decided_settings(name, sig, num_layers, fractions=(0.2, 0.5, 0.8))
    if "decay" in GATES.get(name, key="gate").accepts:
        found += [dataclasses.replace(cfg, decay=4.0) for cfg in found]
    return found


def trace_of(lm):
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    prompts = tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)
    trace = profile_prompts(lm, prompts, N, topk=3, pca_k=8).with_columns(
        model=pl.lit(lm.name), run_id=pl.lit("r"), num_layers=pl.lit(lm.num_layers)
    )
    return prompts, signals_from_trace(trace)


@pytest.fixture(scope="module")
def traced(tiny):
    return trace_of(tiny)


@pytest.fixture(scope="module")
def replays():
    """(model, prompts, signals, full-depth tokens) per (family, dtype, converging), built on first use."""
    built: dict = {}

    def get(family: str, dtype: str, converging: bool):
        key = (family, dtype, converging)
        if key not in built:
            init = [f"model.tiny.init_std={CONVERGING[family]}"] if converging else []
            lm = load(f"model=tiny-{family}", f"dtype={dtype}", *init)
            prompts, sig = trace_of(lm)
            baseline = {p.id: Engine(lm).generate(p.input_ids, N).tokens for p in prompts}
            built[key] = (lm, prompts, sig, baseline)
        return built[key]

    yield get
    built.clear()


def test_signals_cover_every_generated_token(tiny, traced):
    prompts, sig = traced
    assert sig.positions == len(prompts) * N and sig.num_layers == tiny.num_layers
    assert sig.token_index.tolist() == list(range(N)) * len(prompts)
    lengths = {p.id: len(p.input_ids) for p in prompts}
    assert [r.shape[0] for r in sig.prefill_residual] == [lengths[p] for p in sig.prompt_ids]


@pytest.mark.parametrize("gate_name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_simulation_equals_the_closed_loop_until_the_first_divergence(replays, family, dtype, gate_name):
    converging = make_gate(base_setting(gate_name), 4).calibration_lenses() > 0  # a certificate: a converging lens
    lm, prompts, sig, baseline = replays(family, dtype, converging=converging)
    L = lm.num_layers
    compared = 0
    closed_loop = []  # per setting, every step's exit layer
    settings = settings_of(gate_name, sig, L)
    assert settings, f"gate={gate_name}: no threshold decides on tiny-{family} ({dtype})"
    for cfg in settings:
        gate, exits, steps = replay_equals_engine(lm, prompts, sig, baseline, cfg)
        compared += steps
        closed_loop.append((gate, exits))
    assert compared >= len(settings) * len(prompts)
    # the settings must make the gate decide, or the equality above proves nothing
    if gate_name in ("full", "skip"):  # never exit
        assert all(e == L for _, exits in closed_loop for e in exits)
        return
    assert any(e < L for _, exits in closed_loop for e in exits), f"{gate_name} never exits"
    if gate_name != "fixed":  # its one probe layer is its threshold
        assert any(e > gate.min_layer for gate, exits in closed_loop for e in exits), (
            f"{gate_name} always exits at its first probe layer"
        )
    assert len({tuple(exits) for _, exits in closed_loop}) > 1, f"every {gate_name} setting decides alike"


# every gate that compares a signal of the trace (its registration names the column), and those that take
# CALM's decay again with it
KNIFE_EDGE = [spec.name for spec in GATES if spec.signal and not spec.readouts]
KNIFE_EDGE += [f"{name}-decay" for name in KNIFE_EDGE if "decay" in GATES.get(name, key="gate").accepts]


def knife_edge_values(name: str, traced: torch.Tensor, decay: float | None, t: int) -> list[float]:
    """Thresholds of gate ``name`` set exactly on the traced signal values ``traced``, from its registration
    alone: each value v and 1 - v (a rule may compare 1 - signal), and with CALM's decay the threshold whose
    decayed level at token t is v (or 1 - v); a quarter grid besides; each inside the parameter's domain."""
    spec = GATES.get(name, key="gate")
    levels = sorted({float(v) for v in traced.flatten()})
    if decay is not None:  # decayed(theta) = 0.9 theta + 0.1 exp(-decay t / N): the theta whose level is v
        tail = 0.1 * torch.exp(torch.tensor(-decay * t / N, dtype=torch.float64)).item()
        levels = [(v - tail) / 0.9 for v in levels]
    values = {*levels, *(1.0 - v for v in levels), 0.25, 0.5, 0.75, 1.0}
    return sorted(v for v in values if spec.domain(spec.threshold).check(v))


@torch.inference_mode()
@pytest.mark.parametrize("gate_key", sorted(KNIFE_EDGE))
@pytest.mark.parametrize("dtype", DTYPES)
def test_replay_decides_as_the_gate_on_a_knife_edge(tiny, dtype, gate_key):
    """With thresholds set exactly to the traced signal values, the replay's decision at every
    decision position and layer equals the gate's own decide() on the states the engine sees
    there (one row at a time, as its hooks call it): a signal the profile computed any other
    way (bf16 arithmetic, another formula, another comparison) flips decisions here."""
    lm = load(f"model=tiny-{tiny.family}", f"dtype={dtype}")
    a, L = lm.adapter, lm.num_layers
    cfg = compose("prompts=chat", "prompts.n=1").prompts
    prompt = tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)[0]
    decoded = decode_states(lm, prompt.input_ids, n_tokens=N)
    assert decoded.tokens == Engine(lm).generate(prompt.input_ids, N).tokens
    cols = trace_prompt(lm, prompt, decoded.tokens, topk=3, pca_k=8, decoded=decoded)
    hs = decoded.states
    P = len(prompt.input_ids)
    T = P + N - 1
    decide_at = list(range(P - 1, T))  # the first token's decision, then each decode step's

    def grid(c, dt=torch.float32):
        return torch.tensor(cols[c].reshape(T, L), dtype=dt)[decide_at]

    t = 2  # every position is decided as the third generated token (CALM's decay)
    sig = Signals(
        delta=grid("delta"),
        margin=grid("margin"),
        match=grid("top1_match", torch.bool),
        prompt_index=torch.zeros(N, dtype=torch.long),
        token_index=torch.full((N,), t),
        prefill_residual=[torch.tensor(cols["residual_inf"].reshape(T, L)[:P], dtype=torch.float32)],
        prompt_ids=[prompt.id],
        gen_tokens=N,
        extra={c: grid(c) for c in ("prob_margin", "entropy", "cos_prev", "pca_delta")},
        pca_k=8,
    )
    name = gate_key.removesuffix("-decay")
    spec, decay = GATES.get(name, key="gate"), 4.0 if gate_key.endswith("-decay") else None
    base = dataclasses.replace(base_setting(name), decay=decay, **({"k": 8} if "k" in spec.accepts else {}))
    values = knife_edge_values(name, grid(spec.signal)[:, : L - 1], decay, t)
    cfgs = [dataclasses.replace(base, **{spec.threshold: v}) for v in values]
    gates = [make_gate(c, lm) for c in cfgs]
    replayed = type(gates[0]).decisions(
        sig, torch.tensor([threshold_value(g) for g in gates], dtype=torch.float64), cfgs[0].decay
    )
    mismatches = 0
    for k, gate in enumerate(gates):
        # the prefill's states, as the engine calibrates
        at = Decoding(t, N, gate.calibrate(lambda _layer, h: a.lens(h), [h[:, :P] for h in hs]))
        for row, pos in enumerate(decide_at):
            for layer in range(1, L):
                h, h_prev = hs[layer][:, pos], hs[layer - 1][:, pos]
                z = a.lens(h) if gate.probe == "lens" else None
                mismatches += int(bool(gate.decide(layer, h, h_prev, z, at)) != bool(replayed[k, row, layer - 1]))
    assert mismatches == 0, f"{mismatches} of {len(gates) * N * (L - 1)} decisions differ"


def test_simulate_rows_and_predicted_speedup(traced, tiny):
    _, sig = traced
    L = tiny.num_layers
    costs = CostModel(
        layer_ms=1.0,
        head_ms=2.0,
        lens_probe_ms=2.2,
        hidden_probe_ms=0.05,
        kv_ms=0.1,
        overhead_ms=0.5,
        step_ms=L + 2.5,
        num_layers=L,
        extra_probe_ms={"pca:8": 0.3},
    )
    fixed2 = GateConfig(name="fixed", min_layer=1, exit_layer=2)
    cfgs = [fixed2, *(c for name in NAMES for c in settings_of(name, sig, L))]
    assert {c.name for c in cfgs} >= {"full", "fixed", "saturation", "margin"}
    table = simulate(cfgs, sig, costs)
    assert table.height == len(cfgs)
    full = table.filter(pl.col("gate") == "full").row(0, named=True)
    assert full["agreement_tf"] == 1.0 and full["exit_rate"] == 0.0 and full["speedup_model"] == pytest.approx(1.0)
    fixed = table.filter((pl.col("gate") == "fixed") & (pl.col("exit_layer") == 2)).row(0, named=True)
    assert fixed["exit_rate"] == 1.0 and fixed["mean_exit_layer"] == 2.0
    expected = costs.step_ms / costs.token_ms(make_gate(fixed2, L), 2, 1, "propagate")  # exit at 2, one probe
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
    for name, cfg in [
        ("margin", GateConfig(name="margin", theta=1.0)),
        ("saturation", GateConfig(name="saturation", eps=0.1)),
    ]:
        gate = make_gate(cfg, 10)
        for policy in ("propagate", "full"):
            exits = torch.tensor([3.0, 10.0])
            probes = torch.tensor([3.0, 9.0])
            tensor = costs.token_ms(gate, exits, probes, policy)
            assert tensor.tolist() == pytest.approx(
                [costs.token_ms(gate, 3, 3, policy), costs.token_ms(gate, 10, 9, policy)]
            )
