"""The early-exit engine: one contract suite for every gate on every tiny family, both KV
policies, and the model left exactly as it was."""

from __future__ import annotations

import importlib

import pytest
import torch

from conftest import TINY_FAMILIES, compose, load
from sweep.config import GateConfig
from sweep.engine import Engine
from sweep.gates import GATES, make_gate
from sweep.prompts import read_prompts, tokenize_prompts

N = 8
# thresholds that make tiny random models exit at a mix of layers
GATE_CONFIGS = {
    "full": GateConfig(name="full", min_layer=1),
    "fixed": GateConfig(name="fixed", min_layer=1, exit_layer=2),
    "saturation": GateConfig(name="saturation", min_layer=2, eps=0.8),
    "margin": GateConfig(name="margin", min_layer=1, theta=0.4),
    "conformal": GateConfig(name="conformal", min_layer=1, q=0.3),
    "softmax": GateConfig(name="softmax", min_layer=1, theta=0.03, decay=4.0),
    "cosine": GateConfig(name="cosine", min_layer=2, eps=0.2),
    "entropy": GateConfig(name="entropy", min_layer=1, theta=4.3),
    "pca": GateConfig(name="pca", min_layer=2, eps=0.7, k=8),
}


def test_every_registered_gate_is_in_the_contract_suite():
    assert set(GATES.names()) == set(GATE_CONFIGS)


@pytest.fixture(scope="module")
def prompts(tiny):
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    return tokenize_prompts(read_prompts(cfg), cfg, tiny.tokenizer)


@torch.inference_mode()
def replay(lm, prompt_ids, tokens, gate):
    """Full-depth cached decoding of the given tokens, and where ``gate`` would exit each step."""
    a = lm.adapter
    cache = a.new_cache()
    steps = [list(prompt_ids)] + [[t] for t in tokens[:-1]]
    exits, picks = [], []
    gate.bind(a)
    gate.gen_tokens = len(tokens)
    for i, ids in enumerate(steps):
        gate.token_index = i
        with a.capture_hidden() as hs:
            logits = a.forward(torch.tensor([ids]), cache)[:, -1]
        if i == 0:
            gate.calibrate(a.lens, hs)
        exit_layer, pick = a.num_layers, logits.argmax(-1).item()
        for layer in gate.probe_layers():
            h, h_prev = hs[layer][:, -1], hs[layer - 1][:, -1]
            z = a.lens(h) if gate.probe == "lens" else None
            if bool(gate.decide(layer, h, h_prev, z).all()):
                exit_layer, pick = layer, a.lens(h).argmax(-1).item()
                break
        exits.append(exit_layer)
        picks.append(pick)
    return exits, picks, cache


@pytest.mark.parametrize("gate_name", sorted(GATE_CONFIGS))
def test_exits_and_tokens_equal_the_gate_applied_to_full_depth_states(tiny, prompts, gate_name):
    gate = make_gate(GATE_CONFIGS[gate_name], tiny.num_layers)
    engine = Engine(tiny, gate, "full")
    for prompt in prompts:
        gen = engine.generate(prompt.input_ids, N, record=True, keep_cache=True)
        exits, picks, cache = replay(tiny, prompt.input_ids, gen.tokens, gate)
        assert gen.exit_layers == exits
        assert gen.tokens == picks
        assert all(gate.min_layer <= e <= tiny.num_layers for e in gen.exit_layers)
        # kv_policy=full: the cache is exactly the full-depth cache of the same tokens
        for ours, ref in zip(gen.cache.layers, cache.layers):
            assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)


def test_the_suite_exercises_exits(tiny, prompts):
    """The thresholds above must really exit somewhere, or the suite proves nothing.

    The conformal certificate never fires on these random models (their logit-lens
    residual dwarfs their margins, like the post-mortem's real ones); it is exercised on
    a model whose lens converges in the test below.
    """
    for name in ("fixed", "saturation", "margin", "softmax", "cosine", "entropy", "pca"):
        gate = make_gate(GATE_CONFIGS[name], tiny.num_layers)
        exits = [e for p in prompts for e in Engine(tiny, gate, "propagate").generate(p.input_ids, N).exit_layers]
        assert any(e < tiny.num_layers for e in exits), f"{name} never exits on tiny-{tiny.family}"


def test_fixed_gate_exits_exactly_there(tiny, prompts):
    gate = make_gate(GATE_CONFIGS["fixed"], tiny.num_layers)
    gen = Engine(tiny, gate, "propagate").generate(prompts[0].input_ids, N)
    assert gen.exit_layers == [2] * N and gen.probes == [1] * N


def test_full_gate_is_the_baseline(tiny, prompts):
    base = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    full = Engine(tiny, make_gate(GATE_CONFIGS["full"], tiny.num_layers), "propagate").generate(prompts[0].input_ids, N, record=True)
    assert full.tokens == base.tokens and full.exit_layers == [tiny.num_layers] * N
    assert torch.equal(full.logits, base.logits)


def rope_and_rotate(lm, h, position, layer_index):
    """K's RoPE for one position, from the model's own rotary module and its family's helper."""
    model_type = lm.model.config.model_type
    module = importlib.import_module(f"transformers.models.{model_type.removesuffix('_text')}.modeling_{model_type.removesuffix('_text')}")
    pos = torch.tensor([[position]])
    types = getattr(lm.model.config, "layer_types", None)
    if model_type == "gemma3_text":
        cos, sin = lm.adapter.decoder.rotary_emb(h, pos, types[layer_index])
    else:
        cos, sin = lm.adapter.decoder.rotary_emb(h, position_ids=pos)
    return cos, sin, module.apply_rotary_pos_emb


@torch.inference_mode()
@pytest.mark.parametrize("gate_name", ["fixed", "saturation", "margin"])
def test_propagated_entries_equal_the_projections_of_h_l(tiny, prompts, gate_name):
    gate = make_gate(GATE_CONFIGS[gate_name], tiny.num_layers)
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


@pytest.mark.parametrize("gate_name", sorted(GATE_CONFIGS))
def test_model_comes_out_as_it_went_in(tiny, prompts, gate_name):
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    reference = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    gate = make_gate(GATE_CONFIGS[gate_name], tiny.num_layers)
    for policy in ("propagate", "full"):
        Engine(tiny, gate, policy).generate(prompts[0].input_ids, N)
    after = Engine(tiny).generate(prompts[0].input_ids, N, record=True)
    assert after.tokens == reference.tokens and torch.equal(after.logits, reference.logits)
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    modules = [tiny.adapter.decoder.rotary_emb, tiny.adapter.embed, *tiny.adapter.layers]
    assert all(not m._forward_hooks for m in modules)


def test_an_exception_inside_a_step_still_removes_the_hooks():
    lm = load("model=tiny-llama")
    gate = make_gate(GATE_CONFIGS["margin"], lm.num_layers)
    engine = Engine(lm, gate, "propagate")

    def boom(*_args, **_kwargs):
        raise RuntimeError("boom")

    engine._decode_step = boom
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate([1, 2, 3, 4], N)
    assert all(not layer._forward_hooks for layer in lm.adapter.layers)
    assert not lm.adapter.decoder.rotary_emb._forward_hooks


def test_conformal_exits_where_the_certificate_holds():
    """A small-init Qwen3 whose layers barely move the logit lens: the certificate fires."""
    lm = load("model=tiny-qwen3", "model.tiny.init_std=0.02")
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=0.5), lm.num_layers)
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    exited = 0
    for prompt in tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer):
        gen = Engine(lm, gate, "full").generate(prompt.input_ids, N, record=True)
        exits, picks, _ = replay(lm, prompt.input_ids, gen.tokens, gate)
        assert gen.exit_layers == exits and gen.tokens == picks
        exited += sum(e < lm.num_layers for e in gen.exit_layers)
    assert exited > 0


def test_conformal_decision_rule():
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=1.0), 4)
    gate.tau = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    z = torch.tensor([[3.0, 1.0, 0.0], [2.5, 1.0, 0.0], [2.0, 0.0, 0.0]])  # margins 2.0, 1.5, 2.0
    assert gate.decide(2, z, z, z).tolist() == [True, False, True]  # exit iff 2 * tau <= margin


def test_conformal_tau_is_the_prefill_quantile():
    lm = load("model=tiny-qwen2")
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=0.5), lm.num_layers)
    ids = torch.tensor([list(range(1, 40))])
    a = lm.adapter
    with torch.no_grad(), a.capture_hidden() as hs:
        lm.model(input_ids=ids)
    gate.calibrate(a.lens, hs)
    with torch.no_grad():
        z_final = a.lens(hs[-1][0])
        for layer in range(1, lm.num_layers):
            residual = (a.lens(hs[layer][0]) - z_final).abs().amax(-1)
            assert gate.tau[0, layer].item() == pytest.approx(torch.quantile(residual, 0.5).item(), rel=1e-6)


@pytest.mark.parametrize(
    "gate_cfg,message",
    [
        (GateConfig(name="fixed", min_layer=1, exit_layer=5), "gate.exit_layer=5: must be in 1..4 (from gate.min_layer to L=4 for this model)"),
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
