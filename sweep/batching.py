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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from sweep.engine import _Exit, Engine
from sweep.estimators import Timings
from sweep.gates import Gate
from sweep.models import LoadedModel


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


@dataclass
class Padded:
    """A left-padded batch: ``ids`` and ``mask`` (B, longest), ``positions`` (B, longest) each
    row's own position ids (0 at its first real token; 0 on padding), ``lengths`` (B,) the
    prompts' own lengths. ``mask`` is None when every prompt has the same length (nothing to mask)."""

    ids: torch.Tensor
    mask: torch.Tensor | None
    positions: torch.Tensor
    lengths: torch.Tensor


PAD_ID = 0  # any valid id: padded positions are masked out of every real position's attention


def left_pad(prompts: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> Padded:
    """Each prompt whole, right-aligned to the longest one."""
    lengths = torch.tensor([len(p) for p in prompts])
    if int(lengths.min()) < 1:
        raise ValueError("left_pad: empty prompt")
    n = int(lengths.max())
    pads = n - lengths
    ids = torch.tensor([[PAD_ID] * int(pad) + list(p) for p, pad in zip(prompts, pads)], device=device)
    real = torch.arange(n)[None, :] >= pads[:, None]
    positions = (torch.arange(n)[None, :] - pads[:, None]).clamp(min=0)
    mask = None if bool((pads == 0).all()) else real.long().to(device)
    return Padded(ids, mask, positions.to(device), lengths)


class BatchEngine(Engine):
    """Greedy decoding of a batch of prompts (any lengths: left-padded) under one gate (None = full depth)."""

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> BatchGeneration:
        adapter, gate, L = self.adapter, self.gate, self.adapter.num_layers
        cache = adapter.new_cache()
        dev = self.lm.device
        batch = left_pad(prompts, dev)
        B, P = batch.ids.shape
        # the mask of the whole generation, sliced per step (cached + new positions); None without padding
        mask = None if batch.mask is None else torch.cat([batch.mask, batch.mask.new_ones((B, n_tokens))], dim=1)
        next_pos = batch.lengths.to(dev)[:, None]  # the first generated token's position, per row
        self._synchronize()
        t_prefill = time.perf_counter()
        if gate is None:
            logits = adapter.forward(batch.ids, cache, attention_mask=batch.mask, position_ids=batch.positions)[:, -1]
            exits = torch.full((B,), L)
        else:
            logits, hs, _ = self._gated_prefill(batch.ids, cache, n_tokens, batch.mask, batch.positions)
            logits, exits = self._decide_rows(gate, [h[:, -1] for h in hs], logits)
        token = logits.argmax(-1, keepdim=True)
        self._synchronize()
        tokens, exit_rows = [token], [exits]
        out = BatchGeneration(tokens=[], exit_layers=[], prefill_seconds=time.perf_counter() - t_prefill)
        with self._hooks() as rope:
            self._synchronize()
            t0 = time.perf_counter()
            for step in range(1, n_tokens):
                if gate is not None:
                    gate.token_index = step
                inputs = {"attention_mask": None if mask is None else mask[:, : P + step], "position_ids": next_pos + (step - 1)}
                logits, exits, ran, probes = self._batch_step(token, cache, rope, B, inputs)
                token = logits.argmax(-1, keepdim=True)
                tokens.append(token)
                exit_rows.append(exits)
                out.step_layers.append(ran)
                out.probes.append(probes)
            self._synchronize()
            out.decode_seconds = time.perf_counter() - t0
        out.tokens = torch.cat(tokens, dim=1).tolist()
        out.exit_layers = torch.stack(exit_rows, dim=1).tolist()
        self._extra_work(out, exit_rows[1:])
        return out

    def _extra_work(self, out: BatchGeneration, step_exits: list[torch.Tensor]) -> None:
        """Per decode step, after the timed loop: a second head when some rows exited but the
        batch ran on to L (their lens, unless a lens probe already gave it), and one K/V
        overwrite from the earliest exit below where the batch stopped (kv_policy=propagate)."""
        L, lens_probe = self.adapter.num_layers, self.gate is not None and self.gate.probe == "lens"
        for ran, exits in zip(out.step_layers, step_exits):
            out.extra_heads.append(int(ran == L and bool((exits < L).any()) and not lens_probe))
            early = exits[exits < ran]
            out.extra_fill_layers.append(ran - int(early.min()) if self.kv_policy == "propagate" and len(early) else 0)

    def _decide_rows(self, gate: Gate, hidden: list[torch.Tensor], logits: torch.Tensor):
        """Per-row first exit over captured hidden states [h_0..h_L] (each (B, hidden))."""
        L = self.adapter.num_layers
        exits = torch.full((logits.shape[0],), L)
        out = logits.clone()
        for layer in gate.probe_layers():
            z = self.adapter.lens(hidden[layer]) if gate.probe == "lens" else None
            new = gate.decide(layer, hidden[layer], hidden[layer - 1], z).cpu() & (exits == L)
            if new.any():
                rows = new.nonzero().flatten()
                exits[rows] = layer
                lens = z if z is not None else self.adapter.lens(hidden[layer])
                out[rows] = lens[rows.to(lens.device)].to(out.dtype)
        return out, exits

    def _batch_step(self, token: torch.Tensor, cache, rope: dict, B: int, inputs: dict):
        L, step = self.adapter.num_layers, self._step
        step.reset()
        step.rows = torch.full((B,), L)
        step.h_rows = None
        step.z_rows = None
        try:
            logits = self.adapter.forward(token, cache, **inputs)[:, -1]
            ran = L
        except _Exit:
            logits = None
            ran = step.exit_layer
        exits = step.rows
        out = logits.clone() if logits is not None else torch.empty((B, self.adapter.lm_head.out_features), device=self.lm.device)
        exited = (exits < L).nonzero().flatten()
        if len(exited):
            dev = exited.to(self.lm.device)
            z = step.z_rows[dev] if step.z_rows is not None else self.adapter.lens(step.h_rows[dev, -1])
            out[dev] = z.to(out.dtype)
            if self.kv_policy == "propagate":
                self._propagate_rows(cache, rope, exits, ran)
        return out, exits, ran, step.probes

    def _propagate_rows(self, cache, rope: dict, exits: torch.Tensor, ran: int) -> None:
        """K/V of the layers each exited sequence skipped: its own projections of h at its exit."""
        L, stacked = self.adapter.num_layers, self.adapter.stacked_kv()
        if ran < L:  # layers no sequence ran: append for the whole batch
            stacked.fill(self._step.h_rows, cache, ran, L, rope)
        early = (exits < ran).nonzero().flatten()  # rows that exited before the batch stopped: replace what it computed
        if len(early):
            dev = early.to(self.lm.device)
            stacked.overwrite_last(self._step.h_rows[dev], dev, exits[early].to(self.lm.device), cache, ran, rope)

    def _hook(self, layer: int):
        gate, step, lens = self.gate, self._step, self.adapter.lens
        lens_probe = gate.probe == "lens"
        unwind = self.kv_policy != "full"
        L = self.adapter.num_layers

        def after_layer(_module, args, output):
            if step.exit_layer is not None:
                return
            h = output[0] if isinstance(output, tuple) else output
            last, prev = h[:, -1], args[0][:, -1]
            z = lens(last) if lens_probe else None
            step.probes += 1
            open_rows = step.rows == L
            new = gate.decide(layer, last, prev, z).cpu() & open_rows
            if new.any():
                rows = new.nonzero().flatten()
                step.rows[rows] = layer
                if step.h_rows is None:
                    step.h_rows = torch.zeros_like(h[:, -1:])
                    step.z_rows = torch.zeros_like(z) if z is not None else None
                dev = rows.to(h.device)
                step.h_rows[dev] = h[dev, -1:]
                if z is not None:
                    step.z_rows[dev] = z[dev]
            if bool((step.rows < L).all()):
                step.exit_layer = layer
                if unwind:
                    raise _Exit

        return after_layer


@dataclass
class BatchedRuns:
    """A batched trial's reference runs and timings; timings per batch (the unit timed)."""

    prompts: list  # Prompt objects, as given (whole: a batch is left-padded, never cut)
    prompt_input_tokens: list[int]  # per prompt: the tokens it was decoded from (its own length, padding excluded)
    baseline: list[BatchGeneration]  # per batch
    gated: list[BatchGeneration]  # per batch
    timings: Timings  # [round][batch] seconds per side


def batched_runs(lm: LoadedModel, gate: Gate, prompts: list, n: int, kv_policy: str, warmup: int, repeats: int, size: int) -> tuple[BatchedRuns, bool]:
    """Batches of ``size`` consecutive prompts: two full-depth baselines per batch (the
    self-check), the gated run, then both timed interleaved over ``repeats`` rounds; and
    whether every run reproduced its reference tokens."""
    from sweep.errors import ConfigError

    groups = [prompts[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
    if not groups:
        raise ConfigError(f"bench.batch_size={size}: needs at least {size} prompts (prompts.n)")
    inputs = [[list(p.input_ids) for p in g] for g in groups]
    baseline, gated = BatchEngine(lm), BatchEngine(lm, gate, kv_policy)
    for _ in range(warmup):
        baseline.generate_batch(inputs[0], n)
        gated.generate_batch(inputs[0], n)
    base_ref, gated_ref, deterministic = [], [], True
    for ids in inputs:
        first, second = baseline.generate_batch(ids, n), baseline.generate_batch(ids, n)
        deterministic &= first.tokens == second.tokens
        base_ref.append(first)
        gated_ref.append(gated.generate_batch(ids, n))
    t = Timings.empty(repeats, len(groups))
    for r in range(repeats):
        for g, ids in enumerate(inputs):
            sides = [(baseline, base_ref[g], t.base_decode, t.base_prefill), (gated, gated_ref[g], t.gated_decode, t.gated_prefill)]
            for engine, ref, decode, prefill in sides if (r + g) % 2 == 0 else reversed(sides):
                gen = engine.generate_batch(ids, n)
                deterministic &= gen.tokens == ref.tokens
                decode[r][g] = gen.decode_seconds
                prefill[r][g] = gen.prefill_seconds
    used = [p for group in groups for p in group]
    return BatchedRuns(used, [len(p.input_ids) for p in used], base_ref, gated_ref, t), deterministic
