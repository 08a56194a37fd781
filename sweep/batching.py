"""Early exit in a batch: per-sequence decisions, compute saved only when every sequence
has exited (the max-over-batch rule).

Each sequence of the batch decides after each layer like the single-sequence engine; a
sequence that has decided keeps its token from its own exit layer, but the batch's forward
only stops once every sequence has decided. Under kv_policy=propagate a sequence's K/V in
the layers it skipped are its own propagation from h_l, also in layers the batch still ran
(they are overwritten); under full they are the computed ones. Prompts of a batch share one
length (``common_length``), so no padding or attention mask is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from sweep.engine import _Exit, Engine
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


def common_length(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """The last ``min(len)`` tokens of each prompt: one length for the whole batch."""
    n = min(len(p) for p in prompts)
    return [list(p)[-n:] for p in prompts]


class BatchEngine(Engine):
    """Greedy decoding of a batch of equal-length prompts under one gate (None = full depth)."""

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Sequence[int]], n_tokens: int) -> BatchGeneration:
        adapter, gate, L = self.adapter, self.gate, self.adapter.num_layers
        cache = adapter.new_cache()
        ids = torch.tensor([list(p) for p in prompts], device=self.lm.device)
        B = ids.shape[0]
        if gate is None:
            logits = adapter.forward(ids, cache)[:, -1]
            exits = torch.full((B,), L)
        else:
            logits, hs, _ = self._gated_prefill(ids, cache, n_tokens)
            logits, exits = self._decide_rows(gate, [h[:, -1] for h in hs], logits)
        token = logits.argmax(-1, keepdim=True)
        tokens, exit_rows = [token], [exits]
        out = BatchGeneration(tokens=[], exit_layers=[])
        with self._hooks() as rope:
            self._synchronize()
            t0 = time.perf_counter()
            for step in range(1, n_tokens):
                if gate is not None:
                    gate.token_index = step
                logits, exits, ran, probes = self._batch_step(token, cache, rope, B)
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

    def _batch_step(self, token: torch.Tensor, cache, rope: dict, B: int):
        L, step = self.adapter.num_layers, self._step
        step.reset()
        step.rows = torch.full((B,), L)
        step.h_rows = None
        step.z_rows = None
        try:
            logits = self.adapter.forward(token, cache)[:, -1]
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
    """A batched trial's reference runs and timings, laid out per sequence like single ones."""

    prompts: list  # Prompt objects (input_ids cut to their batch's common length)
    baseline: list[BatchGeneration]  # per batch
    gated: list[BatchGeneration]  # per batch
    base_s: list[list[float]]  # [round][sequence]: the batch's decode seconds / batch size
    gated_s: list[list[float]]
    deterministic: bool


def batched_runs(lm: LoadedModel, gate: Gate, prompts: list, n: int, kv_policy: str, warmup: int, repeats: int, size: int) -> BatchedRuns:
    """Batches of ``size`` consecutive prompts: two full-depth baselines per batch (the
    self-check), the gated run, then both timed interleaved over ``repeats`` rounds."""
    import dataclasses

    from sweep.errors import ConfigError

    groups = [prompts[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
    if not groups:
        raise ConfigError(f"bench.batch_size={size}: needs at least {size} prompts (prompts.n)")
    inputs = [common_length([p.input_ids for p in g]) for g in groups]
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
    base_s = [[0.0] * (len(groups) * size) for _ in range(repeats)]
    gated_s = [[0.0] * (len(groups) * size) for _ in range(repeats)]
    for r in range(repeats):
        for g, ids in enumerate(inputs):
            sides = [(baseline, base_ref[g], base_s), (gated, gated_ref[g], gated_s)]
            for engine, ref, out in sides if (r + g) % 2 == 0 else reversed(sides):
                gen = engine.generate_batch(ids, n)
                deterministic &= gen.tokens == ref.tokens
                for row in range(size):
                    out[r][g * size + row] = gen.decode_seconds / size
    cut = [dataclasses.replace(p, input_ids=tuple(ids)) for g, group in enumerate(groups) for p, ids in zip(group, inputs[g])]
    return BatchedRuns(cut, base_ref, gated_ref, base_s, gated_s, deterministic)
