"""What several suites check the same way: a gate replayed on a profile trace against the closed loop,
a batch against each row alone, and thresholds that make a gate really decide on a given tiny model."""

from __future__ import annotations

import dataclasses

import polars as pl
import torch

from sweep.decode.batching import BatchEngine
from sweep.config import GateConfig, compose
from sweep.decode.engine import Engine
from sweep.gates import GATES, make_gate
from sweep.trace.profile import profile_prompts
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.trace.simulate import exit_layers, signals_from_trace, threshold_value

N = 8  # greedy tokens per prompt


def chat_prompts(lm, n: int = 2, start: int = 0):
    cfg = compose(["prompts=chat", f"prompts.n={n}", f"prompts.start={start}"]).prompts
    return tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)


def trace_of(lm, readouts=None):
    """Two chat prompts of ``lm`` and the signals of their profile trace (N tokens each)."""
    prompts = chat_prompts(lm)
    trace = profile_prompts(lm, prompts, N, topk=3, pca_k=8, readouts=readouts).with_columns(
        model=pl.lit(lm.name), run_id=pl.lit("r"), num_layers=pl.lit(lm.num_layers)
    )
    return prompts, signals_from_trace(trace)


def replay_equals_engine(lm, prompts, sig, baseline, cfg, readouts=None):
    """Replay the gate ``cfg`` on the trace and run it closed loop (kv_policy=full): up to each
    prompt's first divergence from full-depth decoding, every step exits where the replay says and
    agrees with full depth exactly when the replay's top-1 matches. Returns (the gate, the closed
    loop's exit layers over all prompts, the steps compared)."""
    gate = make_gate(cfg, lm, readouts)
    order = {p: i for i, p in enumerate(sig.prompt_ids)}
    min_layer = 1 if cfg.name == "fixed" else gate.min_layer
    value = torch.tensor([threshold_value(gate)], dtype=torch.float64)
    lensed = sig.for_lens(cfg.lens or "logit")
    sim = exit_layers(type(gate), lensed, value, min_layer, cfg.decay)[0]
    exits, compared = [], 0
    for prompt in prompts:
        gen = Engine(lm, gate, "full").generate(prompt.input_ids, N)
        exits += gen.exit_layers
        rows = (sig.prompt_index == order[prompt.id]).nonzero().flatten()
        diverged = next((i for i, (a, b) in enumerate(zip(gen.tokens, baseline[prompt.id])) if a != b), N - 1)
        for i in range(diverged + 1):  # decided on the same context as the trace
            t = rows[i]
            assert gen.exit_layers[i] == int(sim[t]), (cfg, prompt.id, i)
            agrees = gen.tokens[i] == baseline[prompt.id][i]
            assert agrees == bool(lensed.match[t, sim[t] - 1]), (cfg, prompt.id, i)
            compared += 1
    return gate, exits, compared


def each_sequence_decides_as_it_would_alone(lm, prompts, gate_cfg, policy, readouts=None):
    """A batch of ``prompts`` under ``gate_cfg`` and ``policy``: every row's tokens and exits equal its
    single-sequence run, and each step runs to the deepest row's exit (L under kv_policy=full)."""
    L = lm.num_layers

    def gate():
        return make_gate(gate_cfg, lm, readouts)  # a learned exit's fitted readouts (None for the others)

    together = BatchEngine(lm, gate(), policy).generate_batch(prompts, N)
    alone = [Engine(lm, gate(), policy).generate(ids, N) for ids in prompts]
    assert together.tokens == [g.tokens for g in alone]
    assert together.exit_layers == [g.exit_layers for g in alone]
    for step, ran in enumerate(together.step_layers, start=1):
        deepest = max(row[step] for row in together.exit_layers)
        assert ran == (L if policy == "full" else deepest)
    return together


# a wide ladder per gate threshold: ``mixed_setting`` picks the value that decides on a given model
LADDERS = {
    "saturation": ("eps", [0.005 * 1.3**i for i in range(40)]),
    "margin": ("theta", [0.01 * 1.3**i for i in range(40)]),
    "softmax": ("theta", [0.001 * 1.25**i for i in range(31)]),
    "cosine": ("eps", [0.0005 * 1.35**i for i in range(30)]),
    "entropy": ("theta", [0.05 + 0.15 * i for i in range(38)]),
    "pca": ("eps", [0.005 * 1.3**i for i in range(36)]),
    "conformal": ("q", [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0]),
    "classifier": ("theta", [0.02 * i for i in range(1, 50)]),
}
FIXED = {  # the rest of each gate's setting (min_layer, k, decay)
    "saturation": {"min_layer": 2},
    "margin": {"min_layer": 1},
    "softmax": {"min_layer": 1},  # CALM's decay is replayed on the tiny families of tests/test_simulate.py
    "cosine": {"min_layer": 2},
    "entropy": {"min_layer": 1},
    "pca": {"min_layer": 2, "k": 8},
    "conformal": {"min_layer": 1},
    "classifier": {"min_layer": 1},
}


def mixed_setting(name: str, sig, num_layers: int, readouts_path: str | None = None) -> GateConfig | None:
    """A setting of gate ``name`` that exits at some decision positions of the trace and runs to L at
    others (the exit fraction nearest one half on its ladder, at the gate's usual min_layer, else the
    first min_layer where one does); None when nothing does. Fixed exits after layer 2, full never."""
    if name == "full":
        return GateConfig(name="full", min_layer=1)
    if name == "skip":  # it names a self-speculative draft (tests/test_skipset.py); in the engine it never exits
        return GateConfig(name="skip", skip="a1")
    if name == "fixed":
        return GateConfig(name="fixed", min_layer=1, exit_layer=2)
    param, ladder = LADDERS[name]
    extra = {"readouts": readouts_path, "lens": "logit"} if name == "classifier" else {}
    first = FIXED[name]["min_layer"]
    for min_layer in [first, *(m for m in range(1, num_layers) if m != first)]:  # the usual one first
        values = torch.tensor(sorted({*ladder, *_quantiles(name, sig, min_layer, num_layers)}), dtype=torch.float64)
        base = GateConfig(name=name, **{**FIXED[name], "min_layer": min_layer}, **{param: ladder[0]}, **extra)
        exits = exit_layers(GATES.get(name, key="gate"), sig, values, min_layer, base.decay)
        fraction = (exits < num_layers).double().mean(dim=1)
        mixed = (fraction > 0) & (fraction < 1)
        if bool(mixed.any()):
            best = int(torch.where(mixed, (fraction - 0.5).abs(), torch.full_like(fraction, 9.0)).argmin())
            return dataclasses.replace(base, **{param: float(values[best])})
    return None


def _quantiles(name: str, sig, min_layer: int, num_layers: int) -> list[float]:
    """Candidate thresholds from the model's own signal where the gate decides (a model whose signals
    all sit in a narrow band, as a Granite's softmax under its logit scale does, needs values inside it)."""
    signal = GATES.get(name, key="gate").spec.signal
    if name in ("conformal",) or signal is None:
        return []
    table = {"delta": sig.delta, "margin": sig.margin}
    values = table[signal] if signal in table else sig.extra.get(signal)
    if values is None:
        return []
    values = values[:, min_layer - 1 : num_layers - 1].double().flatten()
    if name == "cosine":
        values = 1.0 - values  # the gate compares 1 - cos with eps
    qs = torch.quantile(values, torch.linspace(0.02, 0.98, 25, dtype=torch.float64))
    lo = 1e-9 if name in ("saturation", "cosine", "pca") else 0.0
    hi = 1.0 if name in ("softmax", "classifier") else float("inf")
    return [min(max(float(q), lo), hi) for q in qs]
