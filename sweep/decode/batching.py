"""Early exit in a batch: per-sequence decisions, compute saved only when every sequence
has exited (the max-over-batch rule).

Each sequence of the batch decides after each layer like the single-sequence engine; a
sequence that has decided keeps its token from its own exit layer, but the batch's forward
only stops once every sequence has decided. Under kv_policy=propagate a sequence's K/V in
the layers it skipped are its own propagation from h_l, also in layers the batch still ran
(they are overwritten); under full they are the computed ones.

Every batch size decodes the same, untruncated prompts: a batch is left-padded to its longest
prompt (``left_pad``), with an attention mask (0 on padding, passed to the model's own forward,
which builds its causal, sliding-window and padding masks from it) and each row's own position
ids (0 at its first real token), so RoPE, the cache's K/V fill and the gates see each row exactly
as they would see it alone; the last position is real in every row, so decisions never look at
padding, and conformal calibration leaves padded positions out.

The batch steps through the engine's public stepping interface with its own per-row state
(``BatchStep``); a trial groups its prompts with ``batches`` and measures them through the
bench's one protocol (reference runs, interleaved timed rounds), as it does single sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from sweep.decode.engine import Decoded, Engine, StepState
from sweep.models import left_pad
from sweep.gates import Decoding, Gate
from sweep.decode.timing import Timer


@dataclass
class BatchGeneration:
    tokens: list[list[int]]  # per sequence
    exit_layers: list[list[int]]  # per sequence, per generated token (L = full depth)
    step_layers: list[int] = field(default_factory=list)  # layers the batch ran per decode step (max over sequences)
    probes: list[int] = field(default_factory=list)  # probe layers evaluated per decode step
    # per decode step, work a single sequence never does: a second head (the exited rows' lens
    # when the batch ran on to the model's own head) and K/V overwrites (layers, summed over
    # the rows that exited before the batch stopped: one fill from the earliest of them)
    extra_heads: list[int] = field(default_factory=list)
    extra_fill_layers: list[int] = field(default_factory=list)
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0  # prefill, calibration and the first token's decision, as Generation's
    step_rows: list[int] = field(default_factory=list)  # per decode step, the rows decoded (ended rows leave)

    def rows(self) -> list[Decoded]:
        """Each sequence's own record: its tokens and exit layers, and the batch's probes per
        decode step (the first token's, decided on the prefill, counted as 0)."""
        return [Decoded(tokens, exits, [0, *self.probes]) for tokens, exits in zip(self.tokens, self.exit_layers)]


def batches(prompts: list, size: int) -> list[list]:
    """Consecutive groups of ``size`` prompts, each prompt whole (a batch is left-padded, never
    cut); the prompts after the last full group are left out."""
    from sweep.errors import ConfigError

    groups = [prompts[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
    if not groups:
        raise ConfigError(f"bench.batch_size={size}: needs at least {size} prompts (prompts.n)")
    return groups


class BatchStep(StepState):
    """A batch's decode step, decided per row: ``rows`` holds each sequence's exit layer (L =
    still running), ``h_rows`` and ``z_rows`` each exited row's h (and lens) at its exit; the
    step exits (the forward may stop) once every row has."""

    def __init__(self, batch_size: int, num_layers: int) -> None:
        self.batch_size, self.num_layers = batch_size, num_layers
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.rows = torch.full((self.batch_size,), self.num_layers)
        self.h_rows: torch.Tensor | None = None
        self.z_rows: torch.Tensor | None = None

    def record(self, layer: int, h: torch.Tensor, z: torch.Tensor | None, decided: torch.Tensor) -> bool:
        L = self.num_layers
        new = decided.cpu() & (self.rows == L)
        if new.any():
            rows = new.nonzero().flatten()
            self.rows[rows] = layer
            if self.h_rows is None:
                self.h_rows = torch.zeros_like(h[:, -1:])
                self.z_rows = torch.zeros_like(z) if z is not None else None
            dev = rows.to(h.device)
            self.h_rows[dev] = h[dev, -1:]
            if z is not None:
                self.z_rows[dev] = z[dev]
        return bool((self.rows < L).all())

    def fill_source(self, layer: int):
        """Rows that exited before ``layer`` enter it with their h at the exit (the generic K/V fill)."""
        rows = self.rows < layer
        if self.h_rows is None or not bool(rows.any()):
            return None
        return rows.to(self.h_rows.device), self.h_rows


class BatchEngine(Engine):
    """Greedy decoding of a batch of prompts (any lengths: left-padded) under one gate (None = full depth)."""

    @torch.inference_mode()
    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        n_tokens: int,
        stop: Callable[[list[int]], bool] | None = None,
    ) -> BatchGeneration:
        """Up to ``n_tokens`` greedy tokens per prompt. ``stop(tokens)``, asked of each row after each of its tokens,
        ends that row: its tokens end there, and where the cache allows (``Adapter.keep_rows``) the row leaves the
        batch, so the steps after it decode only the rows still running; the batch ends once every row has."""
        adapter, gate, L = self.adapter, self.gate, self.adapter.num_layers
        cache = adapter.new_cache()
        dev = self.lm.device
        batch = left_pad(prompts, dev)
        B, P = batch.ids.shape
        # the mask of the whole generation, sliced per step (cached + new positions); None without padding
        mask = None if batch.mask is None else torch.cat([batch.mask, batch.mask.new_ones((B, n_tokens))], dim=1)
        next_pos = batch.lengths.to(dev)[:, None]  # the first generated token's position, per row
        with Timer(dev) as prefill:
            if gate is None:
                inputs = {"attention_mask": batch.mask, "position_ids": batch.positions}
                logits = adapter.forward(batch.ids, cache, **inputs)[:, -1]
                exits = torch.full((B,), L)
            else:
                logits, hs, at, _ = self.gated_prefill(batch.ids, cache, n_tokens, batch.mask, batch.positions)
                logits, exits = self._decide_rows(gate, [h[:, -1] for h in hs], logits, at)
            token = logits.argmax(-1, keepdim=True)
        tokens, exit_rows = [token], [exits]
        out = BatchGeneration(tokens=[], exit_layers=[], prefill_seconds=prefill.seconds)
        rows = _Rows(B, token, exits, stop)
        calibration = None if gate is None else at.calibration
        with self.stepping(BatchStep(B, L)) as stepper, Timer(dev) as decode:
            for step in range(1, n_tokens):
                if rows.all_ended():
                    break
                keep = rows.leaving()
                if keep is not None and self.adapter.keep_rows(cache, keep.to(dev)):
                    token, next_pos = token[keep.to(dev)], next_pos[keep.to(dev)]
                    mask = None if mask is None else mask[keep.to(dev)]
                    calibration = _select(calibration, keep)
                    stepper.state.batch_size = len(keep)
                    rows.drop(keep)
                if gate is not None:
                    stepper.state.at = Decoding(step, n_tokens, calibration)
                inputs = {
                    "attention_mask": None if mask is None else mask[:, : P + step],
                    "position_ids": next_pos + (step - 1),
                }
                logits, exits, ran, probes = self._batch_step(stepper, token, cache, inputs)
                token = logits.argmax(-1, keepdim=True)
                tokens.append(token)
                exit_rows.append(exits)
                rows.add(token, exits)
                out.step_rows.append(len(token))
                out.step_layers.append(ran)
                out.probes.append(probes)
        out.decode_seconds = decode.seconds
        if stop is None:
            out.tokens = torch.cat(tokens, dim=1).tolist()
            out.exit_layers = torch.stack(exit_rows, dim=1).tolist()
        else:
            out.tokens, out.exit_layers = rows.tokens, rows.exits
        self._extra_work(out, exit_rows[1:])
        return out

    def _extra_work(self, out: BatchGeneration, step_exits: list[torch.Tensor]) -> None:
        """Per decode step, after the timed loop: a second head when some rows exited but the
        batch ran on to L (their lens, unless a lens probe already gave it), and one K/V
        overwrite from the earliest exit below where the batch stopped (kv_policy=propagate on the fast
        path; the generic fill computes those rows' K/V in the layers the batch runs anyway)."""
        L, lens_probe = self.adapter.num_layers, self.gate is not None and self.gate.probe == "lens"
        for ran, exits in zip(out.step_layers, step_exits):
            out.extra_heads.append(int(ran == L and bool((exits < L).any()) and not lens_probe))
            early = exits[exits < ran]
            out.extra_fill_layers.append(ran - int(early.min()) if self.fast_fill and len(early) else 0)

    def _decide_rows(self, gate: Gate, hidden: list[torch.Tensor], logits: torch.Tensor, at: Decoding):
        """Per-row first exit over captured hidden states [h_0..h_L] (each (B, hidden))."""
        L = self.adapter.num_layers
        exits = torch.full((logits.shape[0],), L)
        out = logits.clone()
        for layer in gate.probe_layers():
            z = gate.readout(layer, hidden[layer]) if gate.probe == "lens" else None
            new = gate.decide(layer, hidden[layer], hidden[layer - 1], z, at).cpu() & (exits == L)
            if new.any():
                rows = new.nonzero().flatten()
                exits[rows] = layer
                lens = z if z is not None else gate.readout(layer, hidden[layer])
                out[rows] = lens[rows.to(lens.device)].to(out.dtype)
        return out, exits

    def _batch_step(self, stepper, token: torch.Tensor, cache, inputs: dict):
        """One decode step of the batch: each row's logits (its lens where it exited), exit
        layers, the layers the batch ran, and the probes evaluated."""
        L, state = self.adapter.num_layers, stepper.state
        logits = stepper.forward(token, cache, **inputs)
        ran = L if logits is not None else state.exit_layer
        exits = state.rows
        B = exits.shape[0]
        vocab = self.adapter.lm_head.out_features
        out = logits.clone() if logits is not None else torch.empty((B, vocab), device=self.lm.device)
        exited = (exits < L).nonzero().flatten()
        if len(exited):
            dev = exited.to(self.lm.device)
            if state.z_rows is not None:
                out[dev] = state.z_rows[dev].to(out.dtype)
            else:  # each row read at its own exit layer (a tuned lens's translator is per layer)
                for layer in exits[exited].unique().tolist():
                    rows = (exits == layer).nonzero().flatten().to(self.lm.device)
                    out[rows] = self.gate.readout(layer, state.h_rows[rows, -1]).to(out.dtype)
            if self.fast_fill:  # the generic fill ran inside the forward
                self._propagate_rows(cache, stepper.rope, state.h_rows, exits, ran)
        return out, exits, ran, state.probes

    def _propagate_rows(self, cache, rope: dict, h_rows: torch.Tensor, exits: torch.Tensor, ran: int) -> None:
        """K/V of the layers each exited sequence skipped: its own projections of h at its exit."""
        L, adapter = self.adapter.num_layers, self.adapter
        if ran < L:  # layers no sequence ran: append for the whole batch
            adapter.fill_kv(h_rows, cache, range(ran, L), rope)
        early = (exits < ran).nonzero().flatten()  # rows that exited before the batch stopped: replace what it computed
        if len(early):
            dev = early.to(self.lm.device)
            adapter.overwrite_kv(h_rows[dev], dev, exits[early].to(self.lm.device), cache, ran, rope)


class _Rows:
    """The rows of a batch decoded with a stop rule: each original row's tokens and exit layers up to its stop, which
    rows still run (``alive``: original indices, in the batch's current order) and which have ended."""

    def __init__(self, B: int, token: torch.Tensor, exits: torch.Tensor, stop) -> None:
        self.stop = stop
        self.alive = list(range(B))
        self.tokens = [[t] for t in token[:, 0].tolist()]
        self.exits = [[e] for e in exits.tolist()]
        self.ended = [stop(ids) for ids in self.tokens] if stop is not None else [False] * B

    def all_ended(self) -> bool:
        return self.stop is not None and all(self.ended[i] for i in self.alive)

    def leaving(self) -> torch.Tensor | None:
        """The current batch positions of the rows still running, when some row has ended; else None."""
        if self.stop is None or not any(self.ended[i] for i in self.alive):
            return None
        return torch.tensor([k for k, i in enumerate(self.alive) if not self.ended[i]])

    def drop(self, keep: torch.Tensor) -> None:
        self.alive = [self.alive[k] for k in keep.tolist()]

    def add(self, token: torch.Tensor, exits: torch.Tensor) -> None:
        if self.stop is None:
            return
        for i, t, e in zip(self.alive, token[:, 0].tolist(), exits.tolist()):
            if not self.ended[i]:
                self.tokens[i].append(t)
                self.exits[i].append(e)
                self.ended[i] = self.stop(self.tokens[i])


def _select(calibration, keep: torch.Tensor):
    """A gate's per-prompt calibration for the rows kept (a tensor with a row per sequence; None stays None)."""
    if isinstance(calibration, torch.Tensor) and calibration.dim() > 0:
        return calibration[keep.to(calibration.device)]
    return calibration
