"""Lossless self-speculation: greedy output equals full depth token for token."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import ROOT, compose, load
from sweep.bench.command import prepare
from sweep.bench.protocol import run_trial
from sweep.decode.engine import Engine
from sweep.errors import ConfigError
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.decode.speculative import PrefixDraft, SelfSpeculative

sys.path.insert(0, str(ROOT / "benchmarks"))  # the peer harness (benchmarks/peer_early_exit.py)

FULL_ATTENTION = ["llama", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FULL_ATTENTION)
def test_output_equals_full_depth_for_every_draft_shape(family):
    lm = load(f"model=tiny-{family}")
    cfg = compose("prompts=chat", "prompts.n=2").prompts
    for prompt in tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer):
        baseline = Engine(lm).generate(prompt.input_ids, 17).tokens
        for exit_layer in (1, 2, 3):
            for draft_len in (1, 2, 5):
                gen = SelfSpeculative(lm, PrefixDraft(lm, exit_layer), draft_len).generate(prompt.input_ids, 17)
                assert gen.tokens == baseline, (exit_layer, draft_len)
                assert 0 <= gen.accepted <= gen.drafted and gen.rounds >= 1
                assert gen.tokens_per_verification == pytest.approx(16 / gen.rounds)


def test_perfect_drafts_are_all_accepted():
    """Drafting with all but the last layer of a model whose last layer changes nothing."""
    import torch

    lm = load("model=tiny-llama", "seed=5")
    last = lm.adapter.layers[-1]
    saved = {k: v.clone() for k, v in last.state_dict().items()}
    try:
        with torch.no_grad():
            last.self_attn.o_proj.weight.zero_()
            last.mlp.down_proj.weight.zero_()
        prompt = list(range(3, 40))
        gen = SelfSpeculative(lm, PrefixDraft(lm, 3), 4).generate(prompt, 21)
        assert gen.tokens == Engine(lm).generate(prompt, 21).tokens
        assert gen.acceptance_rate == 1.0 and gen.tokens_per_verification == 5.0
    finally:
        last.load_state_dict(saved)


def test_sliding_window_models_self_speculate_past_their_window():
    lm = load("model=tiny-gemma3")  # a window of 16 positions
    prompt = list(range(3, 40))
    gen = SelfSpeculative(lm, PrefixDraft(lm, 2), 3).generate(prompt, 12)
    assert gen.tokens == Engine(lm).generate(prompt, 12).tokens and gen.rounds > 0


def test_bench_rows_for_self_speculation(tmp_path):
    cfg = compose(
        "model=tiny-qwen2",
        "gate=fixed",
        "gate.exit_layer=2",
        "bench.mode=self_speculative",
        "bench.draft_len=3",
        "prompts.n=2",
        "bench.gen_tokens=10",
        "bench.repeats=1",
        "bench.warmup=0",
        f"results.root={tmp_path}",
    )
    row = run_trial(cfg, *prepare(cfg))
    assert row["status"] == "ok" and row["agreement"] == 1.0 and row["exact_match"] == 1.0
    assert 0 <= row["acceptance_rate"] <= 1 and row["tokens_per_verification"] >= 1
    assert row["acceptance_length"] == pytest.approx(1 + row["mean_accepted_length"])
    assert 0 < row["speedup_model"] < float("inf") and row["draft_ms_per_token"] > 0 and row["verify_ms_per_token"] > 0
    assert row["mode"] == "self_speculative" and row["draft_len"] == 3
    # acceptance as the field reports it: per position given reached, and the accepted-length histogram
    hist, rates = row["accepted_length_hist"], row["acceptance_by_position"]
    assert len(hist) == 4 and len(rates) == 3
    assert sum(a * h for a, h in enumerate(hist)) / sum(hist) == pytest.approx(row["mean_accepted_length"])
    assert rates[0] == pytest.approx(1 - hist[0] / sum(hist))  # position 1 is reached every verification


def test_position_acceptance_by_hand():
    from sweep.decode.skipscreen import position_acceptance

    rates, hist = position_acceptance([3, 3, 2, 3], [0, 3, 1, 2], 3)
    # position 1: 3 of 4 verifications; position 2: reached by the 3 that accepted position 1, accepted by 2;
    # position 3: reached by the 2 that accepted position 2 with 3 drafts, accepted by 1
    assert rates == [0.75, pytest.approx(2 / 3), 0.5] and hist == [1, 1, 1, 1]
    assert position_acceptance([1, 0], [0, 0], 2) == ([0.0, None], [2, 0, 0])  # never reached: None


def test_self_speculation_needs_the_fixed_gate(tmp_path):
    # a config-only rule: it fails when the config is composed, before any model loads
    with pytest.raises(ConfigError, match="bench.mode=self_speculative: drafts with gate=fixed gate.exit_layer=K"):
        compose("model=tiny-qwen2", "gate=margin", "gate.min_layer=1", "bench.mode=self_speculative", "prompts.n=1")


def _brute_rounds(lm, prompt: list[int], tokens: list[int], k: int, n_drafts: int) -> list[int]:
    """Accepted drafts per verification by brute force: each draft the argmax of lm_head(norm(h_K)) from one plain
    forward over the committed tokens and the round's earlier drafts (no cache), each round starting after the
    last committed token."""
    inner = lm.model.model
    accepted, c, n = [], 1, len(tokens)
    while c < n:
        seq, a = prompt + tokens[:c], 0
        for j in range(min(n_drafts, n - c)):
            with torch.no_grad():
                h = lm.model(torch.tensor([seq]), output_hidden_states=True).hidden_states[k][0, -1]
            draft = int(lm.model.lm_head(inner.norm(h)).argmax())
            if draft != tokens[c + j]:
                break
            a, seq = a + 1, seq + [draft]
        accepted.append(a)
        c += a + 1
    return accepted


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_prefix_self_speculation_against_transformers_assistant_early_exit(family):
    """A peer's code path: transformers' assistant_early_exit, given our prefill's token at the end of its prompt (its
    first verification would otherwise check that token, a round ours does not have), decodes the same tokens in the
    same verifications, each starting where ours does and, but for the last, accepting as many drafts. The one
    difference is the end rule: its rounds within a draft length of the end draft one fewer, leaving room for the
    verification's own token (ours draft up to the last token and cut the extra one), so its last verification
    accepts at most the drafts it made. Our counts also equal a brute force from plain forwards. transformers runs in
    the harness that measured it on Qwen and SmolLM2 (``benchmarks/peer_early_exit.py``), which sets its settings
    where transformers reads them and restores them."""
    from transformers.generation.candidate_generator import EarlyExitCandidateGenerator

    from peer_early_exit import hf_early_exit

    methods = dict(vars(EarlyExitCandidateGenerator))
    lm = load(f"model=tiny-{family}")
    config = lm.model.generation_config.to_dict()
    for text in ("def fib(n): return the fibonacci number of n", "Hello there, how are you"):
        prompt = lm.tokenizer(text)["input_ids"]
        for k, n_drafts in ((1, 2), (2, 3), (3, 4)):
            ours = SelfSpeculative(lm, PrefixDraft(lm, k), n_drafts).generate(prompt, 20)
            assert ours.accepted_lengths == _brute_rounds(lm, prompt, ours.tokens, k, n_drafts), (text, k)
            theirs, rounds, _ = hf_early_exit(lm, prompt + ours.tokens[:1], k, n_drafts, 19)
            assert ours.tokens[1:] == theirs, (text, k, n_drafts)
            assert [r["start"] + 1 for r in rounds] == ours.round_starts, (text, k, n_drafts)
            *before, last = rounds
            assert [r["accepted"] for r in before] == ours.accepted_lengths[:-1], (text, k, n_drafts)
            assert last["accepted"] == min(ours.accepted_lengths[-1], last["drafted"])
            # a constant draft length, short of the end by one where ours reach it (their rule: n - start - 1)
            assert [r["drafted"] for r in rounds] == [min(n_drafts, 20 - s - 1) for s in ours.round_starts]
    # the harness leaves transformers as it found it: the class's methods and the model's generation config
    assert dict(vars(EarlyExitCandidateGenerator)) == methods and lm.model.generation_config.to_dict() == config
