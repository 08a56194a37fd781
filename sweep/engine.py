"""The early-exit decode engine: real layer skipping over the model's own forward.

Each decode step runs the model's own forward with a KV cache. Forward hooks on the
decoder layers evaluate the gate after each layer the gate probes; on exit the step
stops (an exception unwinds the model's forward, so layers l+1..L never run) and the
token comes from the logit lens z_l. The KV policy decides what layers l+1..L cache for
that position: ``propagate`` fills them from h_l (K/V projections only), ``full`` lets
the forward run on (exact cache, no saving). Prefill always runs at full depth; the gate
decides the first token from the prefill's last position. Hooks are removed in
``finally``: the model leaves every generation as it entered.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from sweep.gates import Gate
from sweep.models import LoadedModel

KV_POLICIES = ("propagate", "full", "none")  # none: skipped layers get no K/V (self-speculation's drafts)


class _Exit(Exception):
    """Unwinds the model's forward after the exit layer (never escapes this module)."""


@dataclass
class Generation:
    tokens: list[int]
    exit_layers: list[int]  # per generated token; L = full depth
    probes: list[int]  # gate evaluations per generated token
    decode_seconds: float  # steps 2..n (prefill excluded), synchronised on GPU
    calibration_seconds: float = 0.0
    # the request before the first decode step: prefill, the gate's calibration and the first
    # token's decision (synchronised on GPU); prefill + decode is the whole request
    prefill_seconds: float = 0.0
    logits: torch.Tensor | None = None  # (n, vocab) logits each token was taken from, when recorded
    exit_hidden: list[torch.Tensor | None] = field(default_factory=list)  # h_l of exited steps, when recorded
    cache: object | None = None  # the final KV cache, when recorded


@dataclass
class _Step:
    exit_layer: int | None = None
    h: torch.Tensor | None = None
    z: torch.Tensor | None = None
    probes: int = 0
    rows: torch.Tensor | None = None  # batches: each sequence's exit layer (L = still running)
    h_rows: torch.Tensor | None = None  # batches: each exited sequence's h at its exit
    z_rows: torch.Tensor | None = None

    def reset(self) -> None:
        self.exit_layer, self.h, self.z, self.probes = None, None, None, 0


class Engine:
    """Greedy decoding of one model under one gate (None = plain full depth) and KV policy."""

    def __init__(self, lm: LoadedModel, gate: Gate | None = None, kv_policy: str = "propagate") -> None:
        if kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy {kv_policy!r} not in {KV_POLICIES}")
        self.lm = lm
        self.adapter = lm.adapter
        self.gate = gate
        if gate is not None:
            gate.bind(lm.adapter)
        self.kv_policy = kv_policy
        self._step = _Step()
        self._sync = lm.device.type == "cuda"

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], n_tokens: int, *, record: bool = False, keep_cache: bool = False) -> Generation:
        """Exactly ``n_tokens`` (>= 1) greedy tokens; ``record`` keeps the logits and exit hidden
        states, ``keep_cache`` the final KV cache (both for checks, not for timing)."""
        if n_tokens < 1:
            raise ValueError(f"n_tokens={n_tokens}: must be >= 1")
        adapter, gate = self.adapter, self.gate
        cache = adapter.new_cache()
        ids = torch.tensor([list(prompt_ids)], device=self.lm.device)
        self._synchronize()
        t_prefill = time.perf_counter()
        if gate is None:
            logits = adapter.forward(ids, cache)[:, -1]
            first, calibration = (logits, adapter.num_layers, 0, None), 0.0
        else:
            logits, hs, calibration = self._gated_prefill(ids, cache, n_tokens)
            first = self._decide_prefill(hs, logits)
            del hs
        token = first[0].argmax(-1, keepdim=True)
        self._synchronize()
        prefill_seconds = time.perf_counter() - t_prefill
        out_logits, exits, probes, hidden = [first[0]], [first[1]], [first[2]], [first[3]]
        tokens = [token]
        with self._hooks() as rope:
            self._synchronize()
            t0 = time.perf_counter()
            for step in range(1, n_tokens):
                if gate is not None:
                    gate.token_index = step
                logits, exit_layer, n_probes, h = self._decode_step(token, cache, rope)
                token = logits.argmax(-1, keepdim=True)
                tokens.append(token)
                if record:
                    out_logits.append(logits)
                    hidden.append(h)
                exits.append(exit_layer)
                probes.append(n_probes)
            self._synchronize()
            seconds = time.perf_counter() - t0
        return Generation(
            tokens=torch.cat(tokens, dim=1)[0].tolist(),
            exit_layers=exits,
            probes=probes,
            decode_seconds=seconds,
            calibration_seconds=calibration,
            prefill_seconds=prefill_seconds,
            logits=torch.cat(out_logits, dim=0).float().cpu() if record else None,
            exit_hidden=hidden if record else [],
            cache=cache if keep_cache else None,
        )

    def _gated_prefill(self, ids: torch.Tensor, cache, n_tokens: int, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None):
        """Prefill under the gate: the last position's logits, every layer's hidden states
        [h_0..h_L], and the seconds the gate's per-prompt calibration took (conformal: its tau,
        one per batch row, from that row's real positions: ``attention_mask`` marks them in a
        left-padded batch)."""
        gate, adapter = self.gate, self.adapter
        gate.gen_tokens, gate.token_index = n_tokens, 0
        with adapter.capture_hidden() as hs:
            logits = adapter.forward(ids, cache, attention_mask=attention_mask, position_ids=position_ids)[:, -1]
        return logits, hs, gate.calibrate(adapter.lens, hs, mask=None if attention_mask is None else attention_mask.bool())

    def _decide_prefill(self, hs: list[torch.Tensor], logits: torch.Tensor):
        """The gate's decision for the first token, from the prefill's last position."""
        gate, adapter = self.gate, self.adapter
        probes = 0
        for layer in gate.probe_layers():
            h, h_prev = hs[layer][:, -1], hs[layer - 1][:, -1]
            z = adapter.lens(h) if gate.probe == "lens" else None
            probes += 1
            if bool(gate.decide(layer, h, h_prev, z).all()):
                return (z if z is not None else adapter.lens(h)), layer, probes, hs[layer][:, -1:]
        return logits, adapter.num_layers, probes, None

    def _decode_step(self, token: torch.Tensor, cache, rope: dict):
        step = self._step
        step.reset()
        try:
            logits = self.adapter.forward(token, cache)[:, -1]
        except _Exit:
            if self.kv_policy == "propagate":
                start = step.exit_layer  # 0-based index of the first skipped layer
                self.adapter.fill_kv(step.h, cache, range(start, self.adapter.num_layers), rope)
            logits = None
        if step.exit_layer is None:
            return logits, self.adapter.num_layers, step.probes, None
        z = step.z if step.z is not None else self.adapter.lens(step.h[:, -1])
        return z, step.exit_layer, step.probes, step.h

    @contextlib.contextmanager
    def _hooks(self) -> Iterator[dict]:
        """Gate hooks on the probed layers, plus RoPE capture for the K/V fill."""
        if self.gate is None or not self.gate.probe_layers():
            yield {}
            return
        handles = [self.adapter.layers[layer - 1].register_forward_hook(self._hook(layer)) for layer in self.gate.probe_layers()]
        try:
            with self.adapter.capture_rope() as rope:
                yield rope
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, layer: int):
        gate, step, lens = self.gate, self._step, self.adapter.lens
        lens_probe = gate.probe == "lens"
        unwind = self.kv_policy != "full"

        def after_layer(_module, args, output):
            if step.exit_layer is not None:  # kv_policy=full: already exited, layers run on for the cache
                return
            h = output[0] if isinstance(output, tuple) else output
            last, prev = h[:, -1], args[0][:, -1]
            z = lens(last) if lens_probe else None
            step.probes += 1
            if bool(gate.decide(layer, last, prev, z).all()):
                step.exit_layer, step.h, step.z = layer, h, z
                if unwind:
                    raise _Exit

        return after_layer

    def _synchronize(self) -> None:
        if self._sync:
            torch.cuda.synchronize(self.lm.device)


def greedy_decode(lm: LoadedModel, prompt_ids: Sequence[int], n_tokens: int) -> list[int]:
    """Full-depth greedy decoding of exactly ``n_tokens`` tokens (EOS does not stop it)."""
    return Engine(lm).generate(prompt_ids, n_tokens).tokens
