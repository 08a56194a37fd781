"""A fast screen of skip sets: how often a skip-set draft's first token is the full model's, in one pass.

``record`` decodes each prompt at full depth once and keeps every layer's K/V. For a candidate set S,
``first_drafts`` then computes, in one batched forward with S bypassed, the draft's first token of a
round starting at every decode position: row r feeds the token committed at position P + r with the
full-depth K/V of positions < P + r as its context (the rows left-padded to one cache, each with its
own attention mask and position), which is exactly what the closed loop's first draft of a round
starting there computes. So the screen's first-draft match at a round's start is the closed loop's.

A model with state-space layers (a hybrid, or Mamba alone) keeps one recurrent state per sequence, which a batch
of left-padded rows cannot share: there ``record`` keeps the model's own recording cache instead, and each row starts
from a copy of it rolled back to the row's position (``Adapter.crop_cache``: the state-space layers restore their
recorded state, as the closed loop's verification does), one forward per decode position. Slower (a forward and a
cache copy per position, not one batch per prompt) and the same first draft as the closed loop's.

``predict`` chains those matches into rounds (a round of up to N drafts accepts the consecutive
matches from its start, as if each later draft were computed like a first one: the screen's one
approximation, since a closed-loop round's later drafts see the earlier drafts' own K/V) and prices
them with the cost model (a draft step of S, a verification of k + 1 positions), into a predicted
acceptance length and speedup. Milliseconds per candidate on a tiny model: thousands can be screened.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import torch

from sweep.decode.engine import Engine
from sweep.models import LoadedModel
from sweep.gates.skipset import SkipSet


@dataclass
class Recorded:
    """Full-depth greedy decoding of each prompt: its token ids, its n greedy tokens, and the K/V every
    attention layer holds after feeding prompt + tokens[:-1] (one (1, heads, positions, dim) pair per layer); for a
    model with state-space layers, the model's own recording cache after them instead (``caches``; ``kv`` empty)."""

    prompt_ids: list[list[int]]
    tokens: list[list[int]]
    kv: list[list[tuple[torch.Tensor, torch.Tensor]]]
    caches: list | None = None


@dataclass
class FirstDrafts:
    """Per prompt and decode position r (0-based, a round starting after token r): whether the draft's
    first token is the full model's token r + 1, and its top-1 probability."""

    match: list[torch.Tensor]  # bool (n - 1,) per prompt
    confidence: list[torch.Tensor]  # float32 (n - 1,) per prompt


@torch.inference_mode()
def record(lm: LoadedModel, prompt_ids: Sequence[Sequence[int]], n_tokens: int) -> Recorded:
    """Full-depth greedy decoding of each prompt (the engine's), with its final cache's K/V."""
    lm.require(crop=True)  # the closed loop this screens for crops its cache: refused where it cannot
    recurrent = lm.adapter.kind != "attention"
    engine, out = Engine(lm), Recorded([], [], [], [] if recurrent else None)
    for ids in prompt_ids:  # a recording cache: a sliding-window layer keeps every position's K/V too, and a
        # state-space layer the state before each decode step
        gen = engine.generate(list(ids), n_tokens, keep_cache=True, cache=lm.adapter.new_cache(record=1))
        out.prompt_ids.append(list(ids))
        out.tokens.append(gen.tokens)
        if recurrent:
            out.caches.append(gen.cache)
            out.kv.append([])
        else:
            out.kv.append([(layer.keys, layer.values) for layer in gen.cache.layers])
    return out


@torch.inference_mode()
def first_drafts(lm: LoadedModel, rec: Recorded, skip: SkipSet) -> FirstDrafts:
    """The first draft of a round starting at every decode position of every recorded prompt, one
    batched forward with ``skip`` bypassed per prompt (one forward per position from a rolled-back copy of the
    model's own cache, where it has state-space layers)."""
    if rec.caches is not None:
        return _first_drafts_rolled_back(lm, rec, skip)
    adapter, dev = lm.adapter, lm.device
    match, confidence = [], []
    for ids, tokens, kv in zip(rec.prompt_ids, rec.tokens, rec.kv):
        P, R = len(ids), len(tokens) - 1
        longest = P + R - 1  # the context of the last row: positions 0 .. P + R - 2
        cache = adapter.new_cache(record=1)  # sliding-window layers keep the rows' whole contexts
        for j, (k, v) in enumerate(kv):
            rows_k = k.new_zeros((R, *k.shape[1:2], longest, k.shape[-1]))
            rows_v = v.new_zeros((R, *v.shape[1:2], longest, v.shape[-1]))
            for r in range(R):  # row r's context: positions < P + r, right-aligned
                rows_k[r, :, longest - (P + r) :] = k[0, :, : P + r]
                rows_v[r, :, longest - (P + r) :] = v[0, :, : P + r]
            cache.update(rows_k, rows_v, j)
        lengths = torch.arange(P, P + R, device=dev)
        mask = (torch.arange(longest + 1, device=dev)[None, :] >= (longest - lengths)[:, None]).long()
        fed = torch.tensor(tokens[:R], device=dev)[:, None]
        with adapter.bypassing(skip):
            logits = adapter.forward(fed, cache, attention_mask=mask, position_ids=lengths[:, None])[:, -1]
        probs = torch.softmax(logits.float(), dim=-1)
        match.append((logits.argmax(-1) == torch.tensor(tokens[1:], device=dev)).cpu())
        confidence.append(probs.max(-1).values.cpu())
    return FirstDrafts(match, confidence)


def _first_drafts_rolled_back(lm: LoadedModel, rec: Recorded, skip: SkipSet) -> FirstDrafts:
    """``first_drafts`` on a model with state-space layers: row r's draft fed token r from a copy of the recorded
    cache rolled back to prompt + r positions (what the closed loop's cache holds after a verification there)."""
    import copy

    adapter, dev = lm.adapter, lm.device
    match, confidence = [], []
    for ids, tokens, recorded in zip(rec.prompt_ids, rec.tokens, rec.caches):
        P, R = len(ids), len(tokens) - 1
        logits = []
        for r in range(R):
            cache = copy.deepcopy(recorded)
            adapter.crop_cache(cache, P + r)
            fed = torch.tensor([[tokens[r]]], device=dev)
            with adapter.bypassing(skip):
                logits.append(adapter.forward(fed, cache, position_ids=torch.tensor([[P + r]], device=dev))[0, -1])
        if not logits:
            match.append(torch.zeros(0, dtype=torch.bool))
            confidence.append(torch.zeros(0))
            continue
        stacked = torch.stack(logits)
        match.append((stacked.argmax(-1) == torch.tensor(tokens[1:], device=dev)).cpu())
        confidence.append(torch.softmax(stacked.float(), dim=-1).max(-1).values.cpu())
    return FirstDrafts(match, confidence)


@dataclass(frozen=True)
class Prediction:
    """What the screen predicts for a skip set at draft_len N (and draft_stop)."""

    acceptance_rate: float | None  # accepted / drafted
    acceptance_length: float  # 1 + accepted drafts per verification
    rounds: int
    drafted: list[int]  # per round: drafts kept
    draft_steps: list[int]  # per round: draft passes (one more than kept where draft_stop dropped a draft)
    accepted: list[int]  # per round
    decode_steps: int  # tokens 2..n over all prompts
    speedup: float | None  # cost model: full-depth ms of the decode steps / predicted self-speculative ms

    def by_position(self, draft_len: int) -> list[float | None]:
        """The predicted acceptance rate at each draft position, given it was reached (``position_acceptance``)."""
        return position_acceptance(self.drafted, self.accepted, draft_len)[0]

    def histogram(self, draft_len: int) -> list[int]:
        """The predicted count of verifications that accepted 0, 1, ..., draft_len drafts."""
        return position_acceptance(self.drafted, self.accepted, draft_len)[1]


def position_acceptance(
    drafted: Sequence[int], accepted: Sequence[int], draft_len: int
) -> tuple[list[float | None], list[int]]:
    """Acceptance as vLLM and SPEED-Bench report it, from each verification's drafts and accepted drafts: per draft
    position i (1..draft_len) the rate at which a draft at position i was accepted, over the verifications that
    reached it (drafted at least i, the i - 1 before it accepted; None where none did), and the histogram of
    accepted lengths (index a: the verifications that accepted a drafts)."""
    rates: list[float | None] = []
    for i in range(1, draft_len + 1):
        reached = sum(1 for d, a in zip(drafted, accepted) if d >= i and a >= i - 1)
        rates.append(sum(1 for d, a in zip(drafted, accepted) if d >= i and a >= i) / reached if reached else None)
    histogram = [0] * (draft_len + 1)
    for a in accepted:
        histogram[min(a, draft_len)] += 1
    return rates, histogram


def predict(first: FirstDrafts, draft_len: int, draft_stop: float | None = None, costs=None, skip=None) -> Prediction:
    """Rounds of up to ``draft_len`` drafts over every prompt's decode, accepting the consecutive first-draft
    matches from each round's start; a draft below ``draft_stop`` ends the round's drafting (computed, then
    dropped: priced as a draft pass, not verified).
    With ``costs`` (a cost model measured with speculation) and the ``skip`` set, the predicted speedup."""
    drafted, passes, accepted, steps = [], [], [], 0
    for match, conf in zip(first.match, first.confidence):
        n_steps = len(match)  # decode steps: tokens 2..n
        steps += n_steps
        i = 0  # the round's first draft guesses token i + 1
        while i < n_steps:
            m = min(draft_len, n_steps - i)
            k = 0
            while k < m and (draft_stop is None or float(conf[i + k]) >= draft_stop):
                k += 1
            a = 0
            while a < k and bool(match[i + a]):
                a += 1
            drafted.append(k)
            passes.append(k + (k < m))  # a draft below draft_stop was computed, then dropped
            accepted.append(a)
            i += a + 1
    total_drafted = sum(drafted)
    speedup = None
    if costs is not None:
        spec_ms = costs.speculative_ms(costs.skip_draft_ms(skip), drafted, passes)
        speedup = steps * costs.step_ms / spec_ms if spec_ms else None
    return Prediction(
        acceptance_rate=sum(accepted) / total_drafted if total_drafted else None,
        acceptance_length=1.0 + statistics.fmean(accepted) if accepted else 1.0,
        rounds=len(drafted),
        drafted=drafted,
        draft_steps=passes,
        accepted=accepted,
        decode_steps=steps,
        speedup=speedup,
    )
