"""Early exit in a batch: every sequence decides as it would alone, from its whole prompt
(left-padded, never cut); compute stops only when all have exited."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import TINY_FAMILIES, compose, load
from helpers.contract import base_setting, decided_settings, each_sequence_decides_as_it_would_alone, trace_of
from sweep.decode.batching import BatchEngine, batches, left_pad
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial
from sweep.config import GateConfig
from sweep.decode.engine import Engine
from sweep.errors import ConfigError
from sweep.gates import FIRST, GATES, Decoding, Gate, make_gate
from sweep.models.prompts import read_prompts, tokenize_prompts

N = 8
# what a batch decides differs by how a gate reads the layer: one exiting gate per probe kind (none, hidden,
# lens, pca) and one that takes CALM's decay, from the registry (not those calibrated per prompt, tested on
# models where the certificate fires below, nor those reading fitted readouts)
EXITING = [
    s for s in GATES if s.threshold and not s.readouts and make_gate(base_setting(s.name), 4).calibration_lenses() == 0
]
NAMES = list({s.probe: s.name for s in reversed(EXITING)}.values())[::-1]
DECAYING = next(s.name for s in EXITING if "decay" in s.accepts)
KEYS = [*NAMES, f"{DECAYING}-decay"]
CONFORMAL = [GateConfig(name="conformal", min_layer=1, q=q) for q in (0.1, 0.5)]
# Where conformal certifies on a tiny random model: its tau (the lens' prefill residual) must be
# small against its margins. Pre-norm families with a small init add little to the (tied)
# embedding, so every layer's lens already says what the last one says; Gemma3 normalises each
# layer's output before adding it (post-norms), so there the embedding must be large instead.
CONFIDENT_INIT = {"gemma3": 0.5}
CONFIDENT_INIT_DEFAULT = 0.005


def chat_prompts(lm, n: int = 4) -> list[list[int]]:
    cfg = compose("prompts=chat", f"prompts.n={n}").prompts
    return [list(p.input_ids) for p in tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)]


def uneven(lm) -> list[list[int]]:
    """Whole chat prompts of different lengths, plus a long one (longer than either tiny
    sliding window: Mistral's 64, Gemma3's 16) and a short one (padded by more than either)."""
    prompts = chat_prompts(lm)
    return [*prompts, prompts[2] + prompts[3], prompts[1][:7]]


@pytest.fixture(scope="module")
def settings(tiny):
    """Each gate of KEYS with thresholds found on tiny's own trace (``helpers.contract.decided_settings``)."""
    _, sig = trace_of(tiny)
    found = {name: decided_settings(name, sig, tiny.num_layers)[0] for name in [*NAMES, DECAYING]}
    return {**found, f"{DECAYING}-decay": dataclasses.replace(found[DECAYING], decay=4.0)}


@pytest.fixture(scope="module")
def batch(tiny):
    prompts = uneven(tiny)
    assert len({len(p) for p in prompts}) == len(prompts), "the batch should mix prompt lengths"
    assert max(map(len, prompts)) - min(map(len, prompts)) > 64
    return prompts


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def confident(request):
    """A tiny model of each family on which the conformal gate exits."""
    fam = request.param
    return load(f"model=tiny-{fam}", f"model.tiny.init_std={CONFIDENT_INIT.get(fam, CONFIDENT_INIT_DEFAULT)}")


def test_left_pad_keeps_every_prompt_whole():
    padded = left_pad([[5, 6, 7], [8], [1, 2, 3]])
    assert padded.ids.tolist() == [[5, 6, 7], [0, 0, 8], [1, 2, 3]]
    assert padded.mask.tolist() == [[1, 1, 1], [0, 0, 1], [1, 1, 1]]
    assert padded.positions.tolist() == [[0, 1, 2], [0, 0, 0], [0, 1, 2]]
    assert padded.lengths.tolist() == [3, 1, 3]
    assert left_pad([[1, 2], [3, 4]]).mask is None  # one length: nothing to mask


def test_full_depth_rows_equal_their_single_runs(tiny, batch):
    """Every row of a batch of different-length prompts decodes exactly its B=1 tokens, at
    every batch size (the batch's rows in order, and reversed: padding moves)."""
    alone = [Engine(tiny).generate(ids, N).tokens for ids in batch]
    for size in (2, len(batch)):
        for start in range(0, len(batch) - size + 1, size):
            rows = list(range(start, start + size))
            for order in (rows, rows[::-1]):
                together = BatchEngine(tiny).generate_batch([batch[i] for i in order], N)
                assert together.tokens == [alone[i] for i in order]


@pytest.mark.parametrize("policy", ["propagate", "full"])
@pytest.mark.parametrize("key", KEYS)
def testeach_sequence_decides_as_it_would_alone(tiny, batch, settings, key, policy):
    each_sequence_decides_as_it_would_alone(tiny, batch, settings[key], policy)


@pytest.mark.parametrize("policy", ["propagate", "full"])
@pytest.mark.parametrize("gate_cfg", CONFORMAL, ids=[f"q={g.q}" for g in CONFORMAL])
def test_conformal_rows_exit_and_decide_as_they_would_alone(confident, gate_cfg, policy):
    together = each_sequence_decides_as_it_would_alone(confident, uneven(confident), gate_cfg, policy)
    exits = sum(e < confident.num_layers for row in together.exit_layers for e in row)
    assert exits > 0, "conformal should exit on this model"


@torch.inference_mode()
def _teacher_forced(lm, gate_cfg, prompt, tokens):
    """Where ``gate`` exits and which token it emits at each generated position, from one plain
    forward over prompt + tokens (no cache, no hooks, no padding, no other row)."""
    a, L = lm.adapter, lm.num_layers
    gate = make_gate(gate_cfg, lm)
    with a.capture_hidden() as hs:
        logits = lm.model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0]
    calibration = gate.calibrate(lambda _layer, h: a.lens(h), [h[:, : len(prompt)] for h in hs])
    exits, picks = [], []
    for t in range(len(tokens)):
        pos = len(prompt) - 1 + t
        at = Decoding(t, len(tokens), calibration)
        exit_layer, pick = L, int(logits[pos].argmax())
        for layer in gate.probe_layers():
            h, h_prev = hs[layer][:, pos], hs[layer - 1][:, pos]
            z = a.lens(h)
            if bool(gate.decide(layer, h, h_prev, z if gate.probe == "lens" else None, at)[0]):
                exit_layer, pick = layer, int(z.argmax())
                break
        exits.append(exit_layer)
        picks.append(pick)
    return exits, picks


@pytest.mark.parametrize("key", [k for k in KEYS if GATES.get(k.removesuffix("-decay"), key="gate").probe != "none"])
def test_gated_rows_under_full_kv_equal_a_teacher_forced_pass(tiny, batch, settings, key):
    """kv_policy=full keeps the cache exact, so each row's exits and tokens are the gate's rule
    applied to one uncached full-depth pass over that row's own prompt and tokens."""
    gate_cfg = settings[key]
    gen = BatchEngine(tiny, make_gate(gate_cfg, tiny), "full").generate_batch(batch, N)
    for prompt, tokens, exits in zip(batch, gen.tokens, gen.exit_layers):
        assert (exits, tokens) == _teacher_forced(tiny, gate_cfg, prompt, tokens)
    assert any(e < tiny.num_layers for row in gen.exit_layers for e in row)


def test_conformal_rows_under_full_kv_equal_a_teacher_forced_pass(confident):
    gate_cfg, prompts = CONFORMAL[1], uneven(confident)
    gen = BatchEngine(confident, make_gate(gate_cfg, confident), "full").generate_batch(prompts, N)
    for prompt, tokens, exits in zip(prompts, gen.tokens, gen.exit_layers):
        assert (exits, tokens) == _teacher_forced(confident, gate_cfg, prompt, tokens)
    assert any(e < confident.num_layers for row in gen.exit_layers for e in row)


def test_batches_are_whole_consecutive_groups():
    assert batches(list("abcde"), 2) == [["a", "b"], ["c", "d"]]  # the rest, short of a batch, is left out
    with pytest.raises(ConfigError, match="bench.batch_size=3: needs at least 3 prompts"):
        batches(list("ab"), 3)


def test_batched_trials_keep_whole_prompts():
    """The bench's one protocol on batches: whole prompts, timings per batch, the self-check per
    batch (tokens compared), every prompt in the row as given."""
    cfg = compose(
        "model=tiny-llama", "gate=full", "prompts.n=4", "bench.batch_size=2", "bench.gen_tokens=4", "bench.repeats=2"
    )
    lm, gate, prompts = prepare(cfg)
    assert len({len(p.input_ids) for p in prompts}) > 1
    events = []
    row = run_trial(cfg, lm, gate, prompts, on_event=events.append)
    assert row["status"] == "ok" and row["determinism_max_logit_diff"] is None  # batches compare tokens
    assert [e.unit for e in events if e.phase == "reference"] == [0, 1]  # one self-check per batch
    assert len(row["round_baseline_ms"]) == 2 and all(len(r) == 2 for r in row["round_baseline_ms"])  # [round][batch]
    assert row["prompt_ids"] == [p.id for p in prompts] and row["n_prompts"] == 4  # as given: nothing cut
    assert row["prompt_input_tokens"] == [len(p.input_ids) for p in prompts]


def test_batched_bench_rows(tmp_path):
    rows = {}
    for size in (1, 2, 4):
        cfg = compose(
            "model=tiny-llama",
            "gate=fixed",
            "gate.exit_layer=2",
            f"bench.batch_size={size}",
            "prompts.n=4",
            "bench.gen_tokens=6",
            "bench.repeats=1",
            "bench.warmup=0",
        )
        rows[size] = run_trial(cfg, *prepare(cfg))
    for size, row in rows.items():
        assert row["status"] == "ok" and row["batch_size"] == size and row["n_prompts"] == 4
        assert row["step_layers_saved"] == pytest.approx(0.5)  # every sequence exits at 2 of 4
    saturation = compose(
        "model=tiny-llama",
        "gate=saturation",
        "gate.eps=0.8",
        "gate.min_layer=2",
        "bench.batch_size=4",
        "prompts.n=4",
        "bench.gen_tokens=6",
        "bench.repeats=1",
        "bench.warmup=0",
    )
    row = run_trial(saturation, *prepare(saturation))
    assert row["step_layers_saved"] <= row["layers_saved"] + 1e-9  # a batch saves at most what its sequences do


def test_a_batch_needs_enough_prompts():
    # prompts.n known: a config-only rule, checked when the config is composed
    with pytest.raises(ConfigError, match="bench.batch_size=8: needs at least 8 prompts"):
        compose(
            "model=tiny-llama",
            "gate=fixed",
            "gate.exit_layer=2",
            "bench.batch_size=8",
            "prompts.n=4",
            "bench.gen_tokens=4",
        )
    # prompts.n=null (every prompt of the set): checked once the prompts are read
    cfg = compose(
        "model=tiny-llama",
        "gate=fixed",
        "gate.exit_layer=2",
        "bench.batch_size=16",
        "prompts.n=null",
        "bench.gen_tokens=4",
    )
    with pytest.raises(ConfigError, match="bench.batch_size=16: needs at least 16 prompts"):
        run_trial(cfg, *prepare(cfg))


class Scripted(Gate):
    """Row r exits after layer plan[t][r] at generated token t (L: it runs to full depth)."""

    name = "scripted"

    def __init__(self, plan: list[list[int]], lm, probe: str) -> None:
        super().__init__(GateConfig(name="full", min_layer=1), lm.num_layers, adapter=lm.adapter)
        self.plan = torch.tensor(plan)
        self.probe = probe
        self.seal()

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return (self.plan[at.token] <= layer).to(h.device)


# L = 4. Token 0 is the prefill's (not a decode step); rows exit at:
PLAN = [
    [1, 1, 1],
    [1, 2, 4],  # the batch runs to L: a second head; rows 0, 1 overwrite K/V from layer 1: 4 - 1 = 3 layers
    [1, 3, 3],  # stops after 3: no second head; row 0 overwrites layers 2..3: 3 - 1 = 2
    [2, 2, 2],  # all exit together: nothing extra
    [4, 4, 4],  # nobody exits: nothing extra
    [3, 4, 1],  # to L again: a second head; overwrites from layer 1: 3
]
STEP_LAYERS = {"propagate": [4, 3, 2, 4, 4], "full": [4, 4, 4, 4, 4]}
EXTRA_HEADS = {
    ("propagate", "hidden"): [1, 0, 0, 0, 1],
    ("full", "hidden"): [1, 1, 1, 0, 1],
}  # full runs every step to L
EXTRA_FILLS = {"propagate": [3, 2, 0, 0, 3], "full": [0, 0, 0, 0, 0]}  # full computes K/V, fills nothing


@pytest.mark.parametrize("probe", ["hidden", "lens"])
@pytest.mark.parametrize("policy", ["propagate", "full"])
def test_extra_heads_and_fills_of_a_scripted_batch(policy, probe):
    """Rows that exit at hand-picked layers: the extra work per step is counted by hand (a lens
    probe already computed the exited rows' logits: never a second head)."""
    tiny = load("model=tiny-llama")
    assert tiny.num_layers == 4
    gen = BatchEngine(tiny, Scripted(PLAN, tiny, probe), policy).generate_batch(chat_prompts(tiny, 3), len(PLAN))
    assert gen.exit_layers == [list(row) for row in zip(*PLAN)]
    assert gen.step_layers == STEP_LAYERS[policy]
    assert gen.extra_heads == (EXTRA_HEADS[policy, probe] if probe == "hidden" else [0] * 5)
    assert gen.extra_fill_layers == EXTRA_FILLS[policy]


def test_partly_exited_steps_pay_a_second_head_in_the_cost_model():
    """A step where some sequences exited but the batch ran on to L computes the model's head
    for the batch and the exited rows' own lens, and K/V overwrites: the cost model charges both."""
    from sweep.bench.costs import DecodeSteps, cost_model

    tiny = load("model=tiny-llama")
    prompts = chat_prompts(tiny, 3)
    gate = Scripted(PLAN, tiny, "hidden")
    gen = BatchEngine(tiny, gate, "propagate").generate_batch(prompts, len(PLAN))
    costs = cost_model(tiny, prompts[0], gates=[gate])
    plain = costs.speedup(gate, DecodeSteps(gen.step_layers, gen.probes), "propagate")
    charged = costs.speedup(gate, DecodeSteps.of_batches([gen]), "propagate")
    assert charged < plain
    # 2 second heads and 3 + 2 + 3 = 8 overwritten layers over the 5 steps
    assert len(gen.step_layers) * costs.step_ms / charged == pytest.approx(
        len(gen.step_layers) * costs.step_ms / plain + 2 * costs.head_ms + 8 * costs.fill_ms("propagate")
    )
    # a fixed gate exits every sequence at once: nothing extra
    fixed = BatchEngine(tiny, make_gate(GateConfig(name="fixed", exit_layer=2), tiny), "propagate").generate_batch(
        prompts, N
    )
    assert set(fixed.extra_heads) == {0} and set(fixed.extra_fill_layers) == {0}


def _ends_at(lengths: dict[int, int]):
    """A stop rule that ends the row whose first token is k after lengths[k] tokens (rows end at different steps)."""
    return lambda ids: len(ids) >= lengths.get(ids[0], 3)


@pytest.mark.parametrize("key", [None, NAMES[0], "conformal"])
def test_rows_that_stop_leave_the_batch_and_the_rest_decode_as_alone(tiny, batch, settings, key):
    """With a stop rule, each row ends at its own stop (its tokens and exits as its single run with the same rule),
    and where the cache allows, the ended rows leave: later steps decode fewer rows (state-space caches keep them)."""
    gate_cfg = None if key is None else (CONFORMAL[1] if key == "conformal" else settings[key])
    gate = None if gate_cfg is None else make_gate(gate_cfg, tiny)
    policy = "full" if tiny.adapter.path == "none" else "propagate"
    firsts = [Engine(tiny, gate, policy).generate(ids, 1).tokens[0] for ids in batch]
    stop = _ends_at({t: 2 + 3 * i for i, t in enumerate(firsts)})  # a row per length where first tokens differ
    alone = [Engine(tiny, gate, policy).generate(ids, 3 * N, stop=stop) for ids in batch]
    together = BatchEngine(tiny, gate, policy).generate_batch(batch, 3 * N, stop=stop)
    assert together.tokens == [a.tokens for a in alone]
    assert together.exit_layers == [a.exit_layers for a in alone]
    lengths = sorted({len(a.tokens) for a in alone})
    leaves = tiny.adapter.keep_rows(tiny.adapter.new_cache(), torch.tensor([0]))
    if len(lengths) > 1 and leaves:
        assert together.step_rows[-1] < together.step_rows[0] == len(batch)
        assert len(together.step_rows) == lengths[-1] - 1
    else:
        assert set(together.step_rows) == {len(batch)}
