"""Lossless self-speculation: draft cheaply with the model itself, verify with the full model.

Two drafts, one verifier:

- prefix draft (LayerSkip's reframing of early exit, arXiv 2404.16710): layers 1..K and the logit
  lens after layer K (``gate=fixed gate.exit_layer=K``);
- skip-set draft (Draft&Verify, arXiv 2309.08168; SWIFT, arXiv 2410.06916): the full model with a
  set S of attention and MLP sublayers bypassed through the residual, read by the model's own head
  (``gate=skip gate.skip=S``).

Each round drafts up to N tokens (``bench.draft_len``), stopping early at a draft whose top-1
probability is below ``bench.draft_stop`` (that draft is dropped), then verifies them with the
full model in one forward pass over the drafted positions; it keeps the longest prefix the full
model agrees with plus its own token at the first disagreement (or after the last draft), and crops
the KV cache back to what was kept. Greedy output equals full-depth greedy output token for token;
the saving is that verification runs N+1 positions in one pass instead of N+1 single-token steps.

Cache: while drafting, only the layers (or sublayers) the draft runs append K/V; verification
recomputes the drafted positions in every layer from the same tokens, so the cache is cropped to
the committed length first. A skip-set draft passes its positions explicitly (a bypassed first
attention layer does not advance the cache's length). Sliding-window and state-space layers cannot
be cropped back exactly, so models with them are refused.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from sweep.config import GateConfig
from sweep.decode.engine import Engine, Generation
from sweep.errors import ConfigError
from sweep.gates import make_gate
from sweep.models import LoadedModel
from sweep.gates.skipset import SkipSet
from sweep.decode.timing import Timer

Draft = Callable[[torch.Tensor, object, int], torch.Tensor]  # (token, cache, its position) -> next-token logits


@dataclass
class SpeculativeGeneration(Generation):
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    drafted_lengths: list[int] = field(default_factory=list)  # per round: drafts verified (draft_stop may cut them)
    draft_steps: list[int] = field(default_factory=list)  # per round: draft forward passes (a dropped draft's too)
    round_starts: list[int] = field(default_factory=list)  # per round: the index of the token its first draft guesses
    draft_seconds: float = 0.0  # of decode_seconds: drafting
    verify_seconds: float = 0.0  # of decode_seconds: verification passes (crops included)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verification(self) -> float:
        return (len(self.tokens) - 1) / self.rounds if self.rounds else 0.0


class PrefixDraft:
    """Drafts with layers 1..K and the logit lens after layer K."""

    def __init__(self, lm: LoadedModel, exit_layer: int) -> None:
        L = lm.num_layers
        if not 1 <= exit_layer < L:
            raise ConfigError(
                f"gate.exit_layer={exit_layer}: self-speculation drafts with layers 1..K, K in 1..{L - 1}"
            )
        lm.require(lens=True)  # its drafts read the logit lens
        gate = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=exit_layer), lm)
        self.engine = Engine(lm, gate, "none")

    @contextlib.contextmanager
    def session(self) -> Iterator[Draft]:
        with self.engine.stepping() as stepper:
            yield lambda token, cache, _position: stepper.step(token, cache).logits


class SkipDraft:
    """Drafts with the full model minus the sublayers of ``skip``, through the model's own head."""

    def __init__(self, lm: LoadedModel, skip: SkipSet) -> None:
        if skip.max_layer > lm.num_layers:
            raise ConfigError(f"gate.skip={skip}: names layer {skip.max_layer}; layers are 1..{lm.num_layers}")
        skip = skip.resolve(lm.adapter.attention_sublayers())  # attention-free: every attention sublayer
        self.adapter, self.skip, self.device = lm.adapter, skip, lm.device
        for kind in ("a", "m", "s"):  # a sublayer the layer does not have is refused here, in one line
            for layer in skip.layers_of(kind):
                self.adapter.sublayer(layer - 1, kind)
        skippable = set(self.adapter.skippable())  # a mixer beside attention is not: they share one cache layer
        shared = [layer for layer in sorted(skip.mixer) if f"s{layer}" not in skippable]
        if shared:  # its cache layer holds both: a mixer bypassed alone would leave it out of step with the K/V
            raise ConfigError(
                f"gate.skip={skip}: model={lm.name}: layer {shared[0]} runs attention and a state-space mixer side by "
                f"side in one cache layer; a skip set bypasses its attention (a{shared[0]}, attention-free) or its "
                f"MLP, not its mixer alone"
            )

    @contextlib.contextmanager
    def session(self) -> Iterator[Draft]:
        adapter, skip, device = self.adapter, self.skip, self.device

        def draft(token: torch.Tensor, cache, position: int) -> torch.Tensor:
            with adapter.bypassing(skip):
                return adapter.forward(token, cache, position_ids=torch.tensor([[position]], device=device))[:, -1]

        yield draft


class SelfSpeculative:
    """Self-speculative greedy decoding: ``drafter`` drafts up to ``draft_len`` tokens a round."""

    def __init__(self, lm: LoadedModel, drafter, draft_len: int, draft_stop: float | None = None) -> None:
        lm.require(crop=True)  # verification crops the cache back
        self.lm, self.drafter, self.draft_len, self.draft_stop = lm, drafter, draft_len, draft_stop

    @torch.inference_mode()
    def generate(
        self, prompt_ids: Sequence[int], n_tokens: int, *, stop: Callable[[list[int]], bool] | None = None
    ) -> SpeculativeGeneration:
        """``n_tokens`` greedy tokens, the full model's (lossless); ``stop(tokens)``, asked after each verification,
        ends the generation early (the tokens kept are those verified by then)."""
        adapter, dev = self.lm.adapter, self.lm.device
        cache = adapter.new_cache(record=self.draft_len + 1)  # sliding and state-space layers roll back a round
        ids = torch.tensor([list(prompt_ids)], device=dev)
        with Timer(dev) as prefill:
            token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
            adapter.crop_cache(cache, ids.shape[1])  # a recording layer keeps only what the next step needs
        tokens = [token]
        committed = ids.shape[1]  # positions every layer holds; the last committed token is not fed yet
        out = SpeculativeGeneration(
            tokens=[], exit_layers=[], probes=[], decode_seconds=0.0, prefill_seconds=prefill.seconds
        )
        drafting, verifying = Timer(dev), Timer(dev)
        with self.drafter.session() as draft, Timer(dev) as decode:
            while len(tokens) < n_tokens and not (stop is not None and stop(torch.cat(tokens, dim=1)[0].tolist())):
                with drafting:
                    drafted, steps = self._draft(
                        draft, token, cache, committed, min(self.draft_len, n_tokens - len(tokens))
                    )
                with verifying:
                    accepted, new = self._verify(token, drafted, cache, committed)
                out.round_starts.append(len(tokens))
                tokens.extend(new)
                committed += accepted + 1
                token = tokens[-1]
                out.rounds += 1
                out.drafted += len(drafted)
                out.accepted += accepted
                out.accepted_lengths.append(accepted)
                out.drafted_lengths.append(len(drafted))
                out.draft_steps.append(steps)
                out.draft_seconds += drafting.seconds
                out.verify_seconds += verifying.seconds
        out.decode_seconds = decode.seconds
        out.tokens = torch.cat(tokens, dim=1)[0, :n_tokens].tolist()
        L = self.lm.num_layers
        out.exit_layers = [L] * len(out.tokens)  # every kept token is the full model's
        out.probes = [0] * len(out.tokens)
        return out

    def _draft(
        self, draft: Draft, token: torch.Tensor, cache, committed: int, m: int
    ) -> tuple[list[torch.Tensor], int]:
        """Up to ``m`` drafts after ``token``, and the draft forward passes they took: drafting stops at a
        draft whose top-1 probability is below draft_stop, which was computed (a pass) but is not kept."""
        drafted, current, steps = [], token, 0
        for i in range(m):
            logits = draft(current, cache, committed + i)
            steps += 1
            if self.draft_stop is not None and float(torch.softmax(logits.float(), -1).max()) < self.draft_stop:
                break
            current = logits.argmax(-1, keepdim=True)
            drafted.append(current)
        return drafted, steps

    def _verify(self, token: torch.Tensor, drafted: list[torch.Tensor], cache, committed: int):
        """The full model over the last committed token and the drafts in one pass: the accepted drafts
        and the full model's own next token; the cache cropped to what is kept."""
        adapter, m = self.lm.adapter, len(drafted)
        adapter.crop_cache(cache, committed)
        verify_in = torch.cat([token, *drafted], dim=1)
        verified = adapter.forward(verify_in, cache, logits_to_keep=0)[0].argmax(-1)  # (m + 1,)
        accepted = 0
        if m:
            agree = (torch.cat(drafted, dim=1)[0] == verified[:m]).int()
            accepted = int(agree.cumprod(0).sum())
        new = [drafted[i] for i in range(accepted)] + [verified[accepted : accepted + 1][None]]
        adapter.crop_cache(cache, committed + accepted + 1)
        return accepted, new


def drafter_for(lm: LoadedModel, gate) -> PrefixDraft | SkipDraft:
    """The draft a self-speculative trial's gate names: layers 1..K (fixed) or a skip set (skip)."""
    if gate.name == "skip":
        return SkipDraft(lm, SkipSet.parse(gate.cfg.skip))
    return PrefixDraft(lm, gate.exit_layer)
