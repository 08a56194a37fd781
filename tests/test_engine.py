"""The early-exit engine: one contract suite for every gate on every tiny family, both KV
policies, and the model left exactly as it was.

The contract is checked against an independent computation: HF's own forward of the whole
sequence with ``output_hidden_states=True``, every gate's signal and rule written out here
in float64 (none of ``sweep.gates`` is used to derive the expected exits)."""

from __future__ import annotations

import copy
import importlib
import math

import numpy as np
import pytest
import torch

from conftest import compose, load
from sweep.config import GateConfig
from sweep.decode.engine import Engine
from helpers.contract import base_setting, decided_settings, trace_of
from sweep.gates import FIRST, GATES, Decoding, make_gate
from sweep.models.prompts import read_prompts, tokenize_prompts

N = 8
# every registered gate but those that read fitted readouts (tests/test_learned_exits.py holds the classifier to
# its replay): each with thresholds found on the model itself (helpers.contract.decided_settings)
NAMES = sorted(spec.name for spec in GATES if not spec.readouts)
# one exiting gate per probe kind, for what depends on how a gate reads the layer (none, hidden, lens)
BY_PROBE = sorted(
    {spec.probe: spec.name for spec in reversed(list(GATES)) if spec.threshold and not spec.readouts}.values()
)


@pytest.fixture(scope="module")
def settings(tiny):
    """Per gate, a setting that exits at some positions of tiny's trace and runs to L at others, or for a gate
    whose rule decides nothing on this model (the conformal certificate on a random model) its conf file's."""
    _, sig = trace_of(tiny)
    return {name: (decided_settings(name, sig, tiny.num_layers) or [base_setting(name)])[0] for name in NAMES}


@pytest.fixture(scope="module")
def prompts(tiny):
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    return tokenize_prompts(read_prompts(cfg), cfg, tiny.tokenizer)


@torch.inference_mode()
def full_depth_cache(lm, prompt_ids, tokens):
    """The cache of plain full-depth cached decoding fed the given tokens (no gate anywhere)."""
    a = lm.adapter
    cache = a.new_cache()
    for ids in [list(prompt_ids)] + [[t] for t in tokens[:-1]]:
        a.forward(torch.tensor([ids]), cache)
    return cache


REL = 1e-4  # float32 states of a cached decode and of one whole-sequence forward differ by ~1e-6


def lens64(model, h):
    """HF's modules as a user would call them: final norm, lm_head (and Gemma's softcap), in float64 after."""
    z = model.lm_head(model.model.norm(h)).double()
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(z / cap) * cap if cap is not None else z


def subspace(weight, k):
    """An orthonormal basis (k, hidden) of the top-k principal directions of the centred rows, by SVD."""
    w = weight.double()
    _, _, vh = torch.linalg.svd(w - w.mean(0), full_matrices=False)
    return vh[:k]


def calm_level(base, t, n, decay):
    return base if decay is None else min(max(0.9 * base + 0.1 * math.exp(-decay * t / n), 0.0), 1.0)


def rule(cfg, layer, t, n, h, h_prev, z, normed, normed_prev, basis, tau):
    """(signal, level, exits-when-signal-is-above) of the gate ``cfg`` after ``layer`` for one position."""
    if cfg.name == "saturation":
        return float((h - h_prev).norm() / h.norm()), cfg.eps, False
    if cfg.name == "cosine":
        return float(h @ h_prev / (h.norm() * h_prev.norm())), calm_level(1.0 - cfg.eps, t, n, cfg.decay), True
    top = torch.sort(z, descending=True).values
    if cfg.name == "margin":
        return float(top[0] - top[1]), cfg.theta, True
    if cfg.name == "conformal":
        return float(top[0] - top[1]), 2.0 * tau[layer], True
    p = torch.softmax(z, dim=-1)
    if cfg.name == "softmax":
        top_p = torch.sort(p, descending=True).values
        return float(top_p[0] - top_p[1]), calm_level(cfg.theta, t, n, cfg.decay), True
    if cfg.name == "entropy":
        return float(-(p * torch.log(p)).sum()), cfg.theta, False
    if cfg.name == "pca":
        a, b = basis @ normed, basis @ normed_prev
        return float((a - b).norm() / a.norm()), cfg.eps, False
    raise AssertionError(f"gate={cfg.name}: no independent rule here yet; write its rule in rule() above")


@torch.inference_mode()
def expected_exits(lm, prompt_ids, tokens, cfg):
    """Per generated token: the exit layers the gate ``cfg`` may take (one, or two where a signal
    sits within float32 noise of its level) and the token each implies, from one HF forward of
    prompt + tokens[:-1] with output_hidden_states=True. Layers are 1-indexed; L = no exit."""
    # a copy: output_hidden_states makes transformers install its own (lasting) hooks on the layers
    model, L = copy.deepcopy(lm.model), lm.num_layers
    ids = list(prompt_ids) + list(tokens[:-1])
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    hs = [h[0].double() for h in out.hidden_states[:L]]  # h_0..h_{L-1}: HF's last entry is final-normed
    raw = out.hidden_states[:L]
    final = out.logits[0].double()
    P, n = len(prompt_ids), len(tokens)
    min_layer = cfg.exit_layer if cfg.name == "fixed" and cfg.exit_layer else cfg.min_layer
    if cfg.min_depth is not None:
        min_layer = max(1, math.ceil(cfg.min_depth * L))
    basis = subspace(model.lm_head.weight, cfg.k) if cfg.name == "pca" else None
    tau = {}
    if cfg.name == "conformal":
        for layer in range(min_layer, L):
            residual = (lens64(model, raw[layer][0, :P]) - final[:P]).abs().amax(-1)
            tau[layer] = float(np.quantile(residual.numpy(), cfg.q))  # linear interpolation, like numpy's default
    steps = []
    for t in range(n):
        pos = P - 1 + t
        options, picks = [], []
        for layer in range(min_layer, L) if cfg.name not in ("full", "skip", "fixed") else []:
            h, h_prev = hs[layer][pos], hs[layer - 1][pos]
            z = lens64(model, raw[layer][0, pos])
            normed = model.model.norm(raw[layer][0, pos]).double()
            normed_prev = model.model.norm(raw[layer - 1][0, pos]).double()
            signal, level, above = rule(cfg, layer, t, n, h, h_prev, z, normed, normed_prev, basis, tau)
            if abs(signal - level) <= REL * max(abs(level), 1e-3):
                options.append(layer)  # too close to call: either way is right
                picks.append(int(z.argmax()))
                continue
            if (signal >= level) if above else (signal < level):
                options.append(layer)
                picks.append(int(z.argmax()))
                break
        else:
            if cfg.name == "fixed" and min_layer < L:
                options.append(min_layer)
                picks.append(int(lens64(model, raw[min_layer][0, pos]).argmax()))
            else:
                options.append(L)
                picks.append(int(final[pos].argmax()))
        steps.append(dict(zip(options, picks)))
    return steps


def check_against_expected(lm, prompt_ids, gen, cfg):
    """Each step's exit and token are the independent computation's (no gate code involved);
    returns how many steps were decided without a too-close-to-call signal."""
    clear = 0
    for i, allowed in enumerate(expected_exits(lm, prompt_ids, gen.tokens, cfg)):
        assert gen.exit_layers[i] in allowed, (cfg, i, gen.exit_layers[i], allowed)
        assert gen.tokens[i] == allowed[gen.exit_layers[i]], (cfg, i)
        clear += len(allowed) == 1
    return clear


@pytest.mark.parametrize("gate_name", NAMES)
def test_exits_and_tokens_equal_an_independent_computation(tiny, prompts, settings, gate_name):
    cfg = settings[gate_name]
    gate = make_gate(cfg, tiny)
    engine = Engine(tiny, gate, "full")
    clear = 0
    for prompt in prompts:
        gen = engine.generate(prompt.input_ids, N, record=True, keep_cache=True)
        clear += check_against_expected(tiny, prompt.input_ids, gen, cfg)
        assert all(gate.min_layer <= e <= tiny.num_layers for e in gen.exit_layers)
        # kv_policy=full: the cache is exactly the full-depth cache of the same tokens
        cache = full_depth_cache(tiny, prompt.input_ids, gen.tokens)
        for ours, ref in zip(gen.cache.layers, cache.layers):
            assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    assert clear >= len(prompts) * N - 1  # a close call is rare: the check really pins the exits


def test_the_suite_exercises_exits(tiny, prompts, settings):
    """The thresholds above must really exit somewhere, or the suite proves nothing.

    Only a gate calibrated per prompt may decide nothing here: the conformal certificate never fires on these
    random models (their logit-lens residual dwarfs their margins, like the post-mortem's real ones); it is
    exercised on a model whose lens converges in the test below.
    """
    for name in NAMES:
        gate = make_gate(settings[name], tiny)
        exits = [e for p in prompts for e in Engine(tiny, gate, "propagate").generate(p.input_ids, N).exit_layers]
        if gate.threshold is None:
            assert all(e == tiny.num_layers for e in exits), f"{name} has no threshold yet exits"
        elif gate.calibration_lenses() == 0:
            assert any(e < tiny.num_layers for e in exits), f"{name} never exits on tiny-{tiny.family}"


def test_fixed_gate_exits_exactly_there(tiny, prompts):
    gate = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=2), tiny)
    gen = Engine(tiny, gate, "propagate").generate(prompts[0].input_ids, N)
    assert gen.exit_layers == [2] * N and gen.probes == [1] * N


def test_full_gate_is_the_baseline(tiny, prompts):
    base = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    full = Engine(tiny, make_gate(GateConfig(name="full", min_layer=1), tiny), "propagate").generate(
        prompts[0].input_ids, N, record=True
    )
    assert full.tokens == base.tokens and full.exit_layers == [tiny.num_layers] * N
    assert torch.equal(full.logits, base.logits)


def rope_and_rotate(lm, h, position, layer_index):
    """K's RoPE for one position, from the model's own rotary module and its family's helper."""
    model_type = lm.model.config.model_type
    module = importlib.import_module(
        f"transformers.models.{model_type.removesuffix('_text')}.modeling_{model_type.removesuffix('_text')}"
    )
    pos = torch.tensor([[position]])
    types = getattr(lm.model.config, "layer_types", None)
    if model_type == "gemma3_text":
        cos, sin = lm.adapter.decoder.rotary_emb(h, pos, types[layer_index])
    else:
        cos, sin = lm.adapter.decoder.rotary_emb(h, position_ids=pos)
    return cos, sin, module.apply_rotary_pos_emb


@torch.inference_mode()
@pytest.mark.parametrize("gate_name", BY_PROBE)
def test_propagated_entries_equal_the_projections_of_h_l(tiny, prompts, settings, gate_name):
    gate = make_gate(settings[gate_name], tiny)
    prompt = prompts[0]
    gen = Engine(tiny, gate, "propagate").generate(prompt.input_ids, N, record=True, keep_cache=True)
    L, P = tiny.num_layers, len(prompt.input_ids)
    total = P + N - 1
    checked = 0
    for step in range(1, N):  # decode steps; step s fed the token at position P + s - 1
        exit_layer, h = gen.exit_layers[step], gen.exit_hidden[step]
        if exit_layer == L:
            continue
        position = P + step - 1
        for j in range(exit_layer, L):
            layer = tiny.adapter.layers[j]
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            if hasattr(attn, "k_norm"):
                k = attn.k_norm(k)
            cos, sin, apply_rope = rope_and_rotate(tiny, h, position, j)
            _, k = apply_rope(k, k, cos, sin)
            stored = gen.cache.layers[j]
            index = position - (total - stored.keys.shape[-2])
            if index < 0:
                continue  # slid out of a sliding-window layer
            torch.testing.assert_close(stored.keys[:, :, index : index + 1], k, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(stored.values[:, :, index : index + 1], v, rtol=1e-4, atol=1e-5)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("gate_name", NAMES)
def test_model_comes_out_as_it_went_in(tiny, prompts, settings, gate_name):
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    reference = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    gate = make_gate(settings[gate_name], tiny)
    for policy in ("propagate", "full"):
        Engine(tiny, gate, policy).generate(prompts[0].input_ids, N)
    after = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    assert after.tokens == reference.tokens and torch.equal(after.logits, reference.logits)
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    modules = [tiny.adapter.decoder.rotary_emb, tiny.adapter.embed, *tiny.adapter.layers]
    assert all(not m._forward_hooks for m in modules)


def test_an_exception_inside_a_step_still_removes_the_hooks():
    lm = load("model=tiny-llama")

    class Boom(GATES.get("margin", key="gate").cls):
        def decide(self, layer, h, h_prev, z, at=FIRST):  # the prefill decides; the first decode step's hook raises
            if at.token >= 1:
                raise RuntimeError("boom")
            return super().decide(layer, h, h_prev, z, at)

    gate = Boom(GateConfig(name="margin", min_layer=1, theta=0.4), lm.num_layers, adapter=lm.adapter).seal()
    engine = Engine(lm, gate, "propagate")
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate([1, 2, 3, 4], N)
    assert all(not layer._forward_hooks for layer in lm.adapter.layers)
    assert not lm.adapter.decoder.rotary_emb._forward_hooks


@pytest.mark.parametrize("family,init_std", [("gemma3", 0.5), ("llama", 0.02), ("qwen2", 0.017), ("qwen3", 0.02)])
def test_conformal_exits_where_the_certificate_holds(family, init_std):
    """Tiny models whose layers barely move the logit lens (at these init scales): the certificate
    fires at some positions and quantiles and not at others, each exit where the independent
    computation says."""
    lm = load(f"model=tiny-{family}", f"model.tiny.init_std={init_std}")
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    exits = []
    for q in (0.05, 0.5, 1.0):
        gate_cfg = GateConfig(name="conformal", min_layer=1, q=q)
        gate = make_gate(gate_cfg, lm)
        per_q = []
        for prompt in tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer):
            gen = Engine(lm, gate, "full").generate(prompt.input_ids, N, record=True)
            check_against_expected(lm, prompt.input_ids, gen, gate_cfg)
            per_q += gen.exit_layers
        exits.append(per_q)
    flat = [e for per_q in exits for e in per_q]
    assert any(e < lm.num_layers for e in flat) and any(e > 1 for e in flat)
    assert len({tuple(per_q) for per_q in exits}) > 1  # the quantile matters


def test_conformal_decision_rule():
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=1.0), 4)
    at = Decoding(1, 4, calibration=torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]]))  # tau per layer
    z = torch.tensor([[3.0, 1.0, 0.0], [2.5, 1.0, 0.0], [2.0, 0.0, 0.0]])  # margins 2.0, 1.5, 2.0
    assert gate.decide(2, z, z, z, at).tolist() == [True, False, True]  # exit iff 2 * tau <= margin


def test_conformal_tau_is_the_prefill_quantile():
    lm = load("model=tiny-qwen2")
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=0.5), lm)
    ids = torch.tensor([list(range(1, 40))])
    a = lm.adapter
    with torch.no_grad(), a.capture_hidden() as hs:
        lm.model(input_ids=ids)
    tau = gate.calibrate(lambda _layer, h: a.lens(h), hs)
    with torch.no_grad():
        z_final = a.lens(hs[-1][0])
        for layer in range(1, lm.num_layers):
            residual = (a.lens(hs[layer][0]) - z_final).abs().amax(-1)
            assert tau[0, layer].item() == pytest.approx(torch.quantile(residual, 0.5).item(), rel=1e-6)


@pytest.mark.parametrize(
    "gate_cfg,message",
    [
        (
            GateConfig(name="fixed", min_layer=1, exit_layer=5),
            "gate.exit_layer=5: must be in 1..4 (from gate.min_layer to L=4 for this model)",
        ),
        (GateConfig(name="fixed", min_layer=3, exit_layer=2), "gate.exit_layer=2: must be in 3..4"),
        (GateConfig(name="margin", min_layer=5, theta=1.0), "gate.min_layer=5: must be in 1..4 (L=4 for this model)"),
    ],
)
def test_layer_indices_beyond_the_model_are_clear_errors(gate_cfg, message):
    from sweep.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        make_gate(gate_cfg, 4)
    assert message in str(info.value)


def test_min_depth_resolves_against_the_models_depth():
    assert make_gate(GateConfig(name="margin", min_depth=0.5, theta=1.0), 30).min_layer == 15
    assert make_gate(GateConfig(name="margin", min_depth=0.01, theta=1.0), 30).min_layer == 1
    assert make_gate(GateConfig(name="margin", min_depth=1.0, theta=1.0), 4).min_layer == 4
    fixed = make_gate(GateConfig(name="fixed", min_depth=0.5), 30)
    assert fixed.exit_layer == 15 and list(fixed.probe_layers()) == [15]


def test_unknown_kv_policy_is_rejected():
    with pytest.raises(ValueError, match="kv_policy"):
        Engine(load("model=tiny-llama"), None, "bogus")
