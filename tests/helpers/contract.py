"""What several suites check the same way: a gate replayed on a profile trace against the closed loop,
a batch against each row alone, and thresholds that make a gate really decide on a given tiny model."""

from __future__ import annotations

import dataclasses

import polars as pl
import torch

from sweep.decode.batching import BatchEngine
from sweep.config import GateConfig, compose
from sweep.decode.engine import Engine
from sweep.gates import GATES, PARAMS, make_gate
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
    spec = GATES.get(cfg.name, key="gate")  # a threshold that is a layer index is the one probe layer
    min_layer = 1 if spec.threshold and spec.unit(spec.threshold) == "layer" else gate.min_layer
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


def base_setting(name: str, readouts_path: str | None = None) -> GateConfig:
    """Gate ``name`` as its conf file sets it, first exit after layer 1 (min_depth dropped); a gate that reads
    fitted readouts reads ``readouts_path`` through the logit lens; a skip-set draft bypasses layer 1's attention."""
    spec = GATES.get(name, key="gate")
    overrides = [f"gate={name}", "gate.min_layer=1"]
    overrides += [f"gate.readouts={readouts_path or 'readouts.safetensors'}"] * spec.readouts
    overrides += ["bench.mode=self_speculative", "gate.skip=a1"] * ("skip" in spec.params)
    return compose(overrides).gate


def candidates(name: str, sig, min_layer: int, num_layers: int) -> list[float]:
    """Threshold values to try for gate ``name``, from its registration alone: for a layer index, every layer;
    otherwise a wide geometric ladder and values spread over the model's own signal where the gate decides, each
    midway between two it shows (and their complements, for a rule that compares 1 - signal), each inside the
    parameter's domain for this gate."""
    spec = GATES.get(name, key="gate")
    param, domain = spec.threshold, spec.domain(spec.threshold)
    if PARAMS[param].type is int:
        return [float(v) for v in range(1, num_layers + 1) if domain.check(v)]
    values = [1e-4 * 1.3**i for i in range(60)] + [0.02 * i for i in range(1, 50)]
    signal = spec.signal
    traced = {"delta": sig.delta, "margin": sig.margin}.get(signal, sig.extra.get(signal))
    if traced is not None:  # midway in gaps between values the model shows: no decision is a close call
        seen = traced[:, min_layer - 1 : num_layers - 1].double().flatten().unique().sort().values
        gap = seen[1:] - seen[:-1]
        wide = (gap > 2e-3 * seen[1:].abs().clamp_min(1e-3)).nonzero().flatten()
        if len(wide) < 3:  # signals in a narrow band (a Granite's entropy under its logit scale): every gap
            wide = torch.arange(len(gap))
        if len(wide):
            at = wide[torch.linspace(0, len(wide) - 1, min(25, len(wide))).round().long().unique()]
            mids = ((seen[at] + seen[at + 1]) / 2).tolist()
            values += mids + [1.0 - m for m in mids]
    return sorted({v for v in values if domain.check(v)})


def decided_settings(
    name: str, sig, num_layers: int, readouts_path: str | None = None, fractions=(0.5,)
) -> list[GateConfig]:
    """Settings of gate ``name`` that make it decide on the traced model, from the registry alone: at the first
    min_layer where some threshold exits at some decision positions and runs to L at others, the thresholds
    whose exit fractions are nearest each of ``fractions`` (one setting each, distinct), those the closed loop is
    sure to share first; a gate whose threshold is its exit layer (it exits at every position) takes its middle
    thresholds; a gate without a threshold
    (it never exits) is its conf file's setting. Empty when no threshold decides."""
    spec = GATES.get(name, key="gate")
    base = base_setting(name, readouts_path)
    if spec.threshold is None:
        return [base]
    always: list[GateConfig] = []
    for min_layer in range(1, num_layers):
        values = torch.tensor(candidates(name, sig, min_layer, num_layers), dtype=torch.float64)
        setting = dataclasses.replace(base, min_layer=min_layer)
        if "k" in spec.accepts and sig.pca_k is not None:  # the trace's projection size, which the replay reads
            setting = dataclasses.replace(setting, k=sig.pca_k)
        # a threshold that is a layer index is the gate's one probe layer: min_layer masks nothing
        replay_from = 1 if spec.unit(spec.threshold) == "layer" else min_layer
        exits = exit_layers(spec.cls, sig.for_lens(setting.lens or "logit"), values, replay_from, setting.decay)
        fraction = (exits < num_layers).double().mean(dim=1)
        mixed = (fraction > 0) & (fraction < 1)
        sure = _mixed_before_divergence(exits, sig.for_lens(setting.lens or "logit"), num_layers)
        if bool(mixed.any()):
            picked: list[int] = []
            for want in fractions:  # mixed in the closed loop for sure first, then mixed on the trace
                distance = (fraction - want).abs() + 2.0 * (~sure).double() + 9.0 * (~mixed).double()
                for i in distance.argsort().tolist():
                    if bool(mixed[i]) and i not in picked:
                        picked.append(i)
                        break
            return [dataclasses.replace(setting, **{spec.threshold: _value(spec, values[i])}) for i in picked]
        exiting = (fraction == 1).nonzero().flatten().tolist()
        if exiting and not always and spec.unit(spec.threshold) == "layer":  # exits wherever its layer is
            middle = len(exiting) // 2
            order = sorted(exiting, key=lambda i: abs(exiting.index(i) - middle))[: len(fractions)]
            always = [dataclasses.replace(setting, **{spec.threshold: _value(spec, values[i])}) for i in order]
    return always


def _mixed_before_divergence(exits: torch.Tensor, sig, num_layers: int) -> torch.Tensor:
    """(K,) True where threshold k both exits and runs to L at decision positions the closed loop is sure to
    share with the trace: each prompt's positions up to its first exit whose token differs from full depth (the
    closed loop decodes the same context until then; after it, it may decide otherwise)."""
    K, _ = exits.shape
    sure = torch.zeros(K, dtype=torch.bool)
    for k in range(K):
        early = late = False
        for p in range(len(sig.prompt_ids)):
            rows = (sig.prompt_index == p).nonzero().flatten()
            for t in rows[sig.token_index[rows].argsort()].tolist():
                e = int(exits[k, t])
                early, late = early or e < num_layers, late or e == num_layers
                if e < num_layers and not bool(sig.match[t, e - 1]):
                    break  # the exited token differs: the closed loop's context is another from here
        sure[k] = early and late
    return sure


def _value(spec, value: torch.Tensor):
    return int(value) if PARAMS[spec.threshold].type is int else float(value)


def mixed_setting(name: str, sig, num_layers: int, readouts_path: str | None = None) -> GateConfig | None:
    """A setting of gate ``name`` that exits at some decision positions of the trace and runs to L at others
    (the exit fraction nearest one half; ``decided_settings``); None when none does."""
    found = decided_settings(name, sig, num_layers, readouts_path)
    return found[0] if found else None
