"""Lossless self-speculation (LayerSkip's reframing of early exit, arXiv 2404.16710).

Draft up to N tokens with the first K layers (the logit lens after layer K), then verify
them with the full model in one forward pass over the drafted positions; keep the longest
prefix the full model agrees with plus its own token at the first disagreement (or after
the last draft), and crop the KV cache back to what was kept. Greedy output equals
full-depth greedy output token for token; the saving is that verification runs N+1
positions in one pass instead of N+1 single-token steps.

Cache: during drafting only layers 1..K append K/V; verification recomputes the drafted
positions in every layer from the same tokens, so the cache is cropped to the committed
length first. Sliding-window layers and state-space layers cannot be cropped back exactly, so
models with them are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from sweep.config import GateConfig
from sweep.engine import Engine, Generation
from sweep.errors import ConfigError
from sweep.gates import make_gate
from sweep.models import LoadedModel
from sweep.timing import Timer


@dataclass
class SpeculativeGeneration(Generation):
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_lengths: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verification(self) -> float:
        return (len(self.tokens) - 1) / self.rounds if self.rounds else 0.0


class SelfSpeculative:
    """Self-speculative greedy decoding with draft depth ``exit_layer`` and ``draft_len`` drafts."""

    def __init__(self, lm: LoadedModel, exit_layer: int, draft_len: int) -> None:
        L = lm.num_layers
        if not 1 <= exit_layer < L:
            raise ConfigError(
                f"gate.exit_layer={exit_layer}: self-speculation drafts with layers 1..K, K in 1..{L - 1}"
            )
        lm.require(lens=True, crop=True)  # drafts read the logit lens; verification crops the cache
        self.lm, self.exit_layer, self.draft_len = lm, exit_layer, draft_len
        gate = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=exit_layer), L)
        self.drafter = Engine(lm, gate, "none")

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], n_tokens: int) -> SpeculativeGeneration:
        adapter, drafter = self.lm.adapter, self.drafter
        cache = adapter.new_cache()
        ids = torch.tensor([list(prompt_ids)], device=self.lm.device)
        with Timer(self.lm.device) as prefill:
            token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
        tokens = [token]
        committed = ids.shape[1]  # positions every layer holds
        out = SpeculativeGeneration(
            tokens=[], exit_layers=[], probes=[], decode_seconds=0.0, prefill_seconds=prefill.seconds
        )
        with drafter.stepping() as stepper, Timer(self.lm.device) as decode:
            while len(tokens) < n_tokens:
                m = min(self.draft_len, n_tokens - len(tokens))
                draft, current = [], token
                for _ in range(m):
                    current = stepper.step(current, cache).logits.argmax(-1, keepdim=True)
                    draft.append(current)
                adapter.crop_cache(cache, committed)
                verify_in = torch.cat([token, *draft], dim=1)  # the last committed token, then the drafts
                verified = adapter.forward(verify_in, cache, logits_to_keep=0)[0].argmax(-1)  # (m + 1,)
                drafted = torch.cat(draft, dim=1)[0]
                agree = (drafted == verified[:m]).int()
                accepted = int(agree.cumprod(0).sum())
                new = [drafted[i : i + 1][None] for i in range(accepted)] + [verified[accepted : accepted + 1][None]]
                tokens.extend(new)
                committed += accepted + 1
                adapter.crop_cache(cache, committed)
                token = tokens[-1]
                out.rounds += 1
                out.drafted += m
                out.accepted += accepted
                out.accepted_lengths.append(accepted)
        out.decode_seconds = decode.seconds
        out.tokens = torch.cat(tokens, dim=1)[0, :n_tokens].tolist()
        L = self.lm.num_layers
        out.exit_layers = [L] * len(out.tokens)  # every kept token is the full model's
        out.probes = [0] * len(out.tokens)
        return out
