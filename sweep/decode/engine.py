"""The early-exit decode engine: real layer skipping over the model's own forward.

Each decode step runs the model's own forward with a KV cache. Forward hooks on the
decoder layers evaluate the gate after each layer the gate probes; on exit the step
stops (an exception unwinds the model's forward, so layers l+1..L never run) and the
token comes from the gate's readout of h_l (``Gate.readout``: the logit lens z_l, or a
tuned lens). The KV policy decides what layers l+1..L cache for that position:
``propagate`` fills them from h_l (K/V only: after the unwind with the stacked projection on the
fast path, or inside the forward by each layer's own modules on the generic path, see
``Adapter.filling``), ``full`` lets the forward run on (exact cache, no saving). Prefill always
runs at full depth; the gate decides the first token from the prefill's last position. Hooks are
removed in ``finally``: the model leaves every generation as it entered.

The stepping interface is public, for every decoder that steps under the gate (this
engine, batches, self-speculation's drafts, the cost model's measured steps)::

    with engine.stepping() as stepper:          # gate hooks (and RoPE capture) installed
        out = stepper.step(token, cache)        # one decode step: StepResult
        out.logits, out.exit_layer, out.probes, out.hidden

``stepping(state)`` takes a ``StepState`` subclass that decides per batch row instead
(``sweep.decode.batching.BatchStep``); ``stepper.forward`` then runs the bare, possibly unwound,
forward and leaves the rest of the step to the caller.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Sequence

import torch

from sweep.gates import FIRST, Decoding, Gate
from sweep.models import LoadedModel, StepExit
from sweep.decode.timing import Timer

# chooses token ``index`` (0-based) of a generation from its logits (1, vocab): a (1, 1) tensor of its id
Pick = Callable[[torch.Tensor, int], torch.Tensor]

KV_POLICIES = ("propagate", "full", "none")  # none: skipped layers get no K/V (self-speculation's drafts)


@dataclass
class Decoded:
    """One sequence's greedy tokens with, per token, its exit layer (L = full depth) and the
    gate evaluations (probes) it took: what a trial compares and counts, whichever decoder
    produced it (a single sequence, or one row of a batch)."""

    tokens: list[int]
    exit_layers: list[int]
    probes: list[int]


@dataclass
class Generation(Decoded):
    decode_seconds: float  # steps 2..n (prefill excluded), synchronised on GPU
    calibration_seconds: float = 0.0
    # the request before the first decode step: prefill, the gate's calibration and the first
    # token's decision (synchronised on GPU); prefill + decode is the whole request
    prefill_seconds: float = 0.0
    logits: torch.Tensor | None = None  # (n, vocab) logits each token was taken from, when recorded
    exit_hidden: list[torch.Tensor | None] = field(default_factory=list)  # h_l of exited steps, when recorded
    cache: object | None = None  # the final KV cache, when recorded


class StepResult(NamedTuple):
    """One token's decision: the logits it is taken from (the lens at the exit layer, or the
    model's head), the exit layer (L = full depth), the probes evaluated, and h at the exit
    (batch, 1, hidden; None at full depth)."""

    logits: torch.Tensor
    exit_layer: int
    probes: int
    hidden: torch.Tensor | None


class StepState:
    """What the gate hooks of the current decode step have seen. The hooks count probes and
    hand every decision to ``record``; once it returns True the step has exited at that
    layer (``exit_layer``) and the forward unwinds, unless kv_policy=full lets it run on.
    This one decides for the whole batch at once (a single sequence); subclasses decide per
    row (``sweep.decode.batching.BatchStep``)."""

    def __init__(self) -> None:
        self.reset()

    at: Decoding = FIRST  # where the generation stands: the decoder sets it before each step, the hooks pass it

    def reset(self) -> None:
        self.exit_layer: int | None = None
        self.probes = 0
        self.h: torch.Tensor | None = None
        self.z: torch.Tensor | None = None

    def record(self, layer: int, h: torch.Tensor, z: torch.Tensor | None, decided: torch.Tensor) -> bool:
        """The gate's decision after ``layer`` (``h`` that layer's output, ``z`` its lens when
        the probe computed it); True when the step exits here."""
        if bool(decided.all()):
            self.h, self.z = h, z
            return True
        return False

    def fill_source(self, layer: int):
        """For the generic K/V fill (``Adapter.filling``): (rows, h) where layer ``layer`` must take
        its K/V from ``h`` (rows None: every row), or None where it runs as it is."""
        if self.exit_layer is not None and layer > self.exit_layer:
            return None, self.h
        return None


class Stepper:
    """Decode steps under an engine's gate hooks; made by ``Engine.stepping``, valid inside it."""

    def __init__(self, engine: Engine, state: StepState, rope: dict) -> None:
        self.engine, self.state = engine, state
        self.rope = rope  # the (cos, sin) of the current step, for K/V fills (``Adapter.capture_rope``)

    def forward(self, token: torch.Tensor, cache, **inputs) -> torch.Tensor | None:
        """The model's own forward of one step (``inputs``: ``Adapter.forward``'s mask and
        positions); the last position's logits, or None when the state exited and the
        forward unwound (``state.exit_layer`` says where; the skipped layers have no K/V)."""
        self.state.reset()
        try:
            return self.engine.adapter.forward(token, cache, **inputs)[:, -1]
        except StepExit:
            return None

    def step(self, token: torch.Tensor, cache) -> StepResult:
        """One decode step of one sequence: the forward, the K/V of skipped layers under
        kv_policy=propagate, and the token's logits (the lens at the exit layer)."""
        adapter, state = self.engine.adapter, self.state
        logits = self.forward(token, cache)
        if logits is None and self.engine.fast_fill:  # the generic fill ran inside the forward
            adapter.fill_kv(state.h, cache, range(state.exit_layer, adapter.num_layers), self.rope)
        if state.exit_layer is None:
            return StepResult(logits, adapter.num_layers, state.probes, None)
        z = state.z if state.z is not None else self.engine.gate.readout(state.exit_layer, state.h[:, -1])
        return StepResult(z, state.exit_layer, state.probes, state.h)


class Engine:
    """Greedy decoding of one model under one gate (None = plain full depth) and KV policy."""

    def __init__(self, lm: LoadedModel, gate: Gate | None = None, kv_policy: str = "propagate") -> None:
        if kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy {kv_policy!r} not in {KV_POLICIES}")
        self.lm = lm
        self.adapter = lm.adapter
        self.gate = gate
        if gate is not None and gate.adapter is not lm.adapter and (gate.adapter is not None or gate.probe_layers()):
            whose = "without a model" if gate.adapter is None else "for another model"
            raise ValueError(f"gate={gate.name} was built {whose}: make_gate(cfg, lm, readouts) with this engine's lm")
        self.kv_policy = kv_policy
        if gate is not None and gate.probe_layers() and kv_policy == "propagate":
            lm.require(kv_policy=kv_policy)
        # kv_policy=propagate fills skipped layers after the forward unwinds (fast path) or inside it (generic)
        self.fast_fill = kv_policy == "propagate" and self.adapter.kv_path == "fast"
        self.unwind = kv_policy == "none" or self.fast_fill

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        n_tokens: int,
        *,
        record: bool = False,
        keep_cache: bool = False,
        pick: Pick | None = None,
        stop: Callable[[list[int]], bool] | None = None,
        cache=None,
    ) -> Generation:
        """Exactly ``n_tokens`` (>= 1) greedy tokens; ``record`` keeps the logits and exit hidden
        states, ``keep_cache`` the final KV cache (both for checks, not for timing). ``pick(logits, index)``
        chooses token ``index`` instead of the argmax (a sample, or a teacher-forced token); ``stop(tokens)``,
        asked after each token, ends the generation early (a task's stop sequence). ``cache``: an empty cache to
        decode into (``Adapter.new_cache(record=...)``: sliding-window layers keep every position)."""
        if n_tokens < 1:
            raise ValueError(f"n_tokens={n_tokens}: must be >= 1")
        adapter, gate = self.adapter, self.gate
        choose = pick if pick is not None else _argmax
        cache = adapter.new_cache() if cache is None else cache  # a caller's: a recording one keeps every position
        ids = torch.tensor([list(prompt_ids)], device=self.lm.device)
        with Timer(self.lm.device) as prefill:
            if gate is None:
                logits = adapter.forward(ids, cache)[:, -1]
                first, calibration = StepResult(logits, adapter.num_layers, 0, None), 0.0
            else:
                logits, hs, at, calibration = self.gated_prefill(ids, cache, n_tokens)
                first = self._decide_prefill(hs, logits, at)
                del hs
            token = choose(first.logits, 0)
        out_logits, exits, probes, hidden = [first.logits], [first.exit_layer], [first.probes], [first.hidden]
        tokens = [token]
        ids_so_far = [int(token)] if stop is not None else []
        with self.stepping() as stepper, Timer(self.lm.device) as decode:
            for index in range(1, n_tokens):
                if stop is not None and stop(ids_so_far):
                    break
                if gate is not None:
                    stepper.state.at = Decoding(index, n_tokens, at.calibration)
                out = stepper.step(token, cache)
                token = choose(out.logits, index)
                tokens.append(token)
                if stop is not None:
                    ids_so_far.append(int(token))
                if record:
                    out_logits.append(out.logits)
                    hidden.append(out.hidden)
                exits.append(out.exit_layer)
                probes.append(out.probes)
        return Generation(
            tokens=torch.cat(tokens, dim=1)[0].tolist(),
            exit_layers=exits,
            probes=probes,
            decode_seconds=decode.seconds,
            calibration_seconds=calibration,
            prefill_seconds=prefill.seconds,
            logits=torch.cat(out_logits, dim=0).float().cpu() if record else None,
            exit_hidden=hidden if record else [],
            cache=cache if keep_cache else None,
        )

    def gated_prefill(
        self,
        ids: torch.Tensor,
        cache,
        n_tokens: int,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        """Prefill under the gate: the last position's logits, every layer's hidden states
        [h_0..h_L], where the generation of ``n_tokens`` stands (``Decoding`` of its first token, with
        the gate's per-prompt calibration: conformal's tau, one per batch row, from that row's real
        positions, which ``attention_mask`` marks in a left-padded batch) and the calibration's seconds."""
        gate, adapter = self.gate, self.adapter
        with adapter.capture_hidden() as hs:
            logits = adapter.forward(ids, cache, attention_mask=attention_mask, position_ids=position_ids)[:, -1]
        mask = None if attention_mask is None else attention_mask.bool()
        with Timer(self.lm.device) as timed:
            calibration = gate.calibrate(self._calibration_lens, hs, mask=mask)
        return logits, hs, Decoding(0, n_tokens, calibration), timed.seconds

    def _calibration_lens(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The lens a gate's calibration reads layer ``layer`` with: the gate's readout, the model's head at L."""
        return self.adapter.lens(h) if layer >= self.adapter.num_layers else self.gate.readout(layer, h)

    def _decide_prefill(self, hs: list[torch.Tensor], logits: torch.Tensor, at: Decoding) -> StepResult:
        """The gate's decision for the first token, from the prefill's last position."""
        gate, adapter = self.gate, self.adapter
        probes = 0
        for layer in gate.probe_layers():
            h, h_prev = hs[layer][:, -1], hs[layer - 1][:, -1]
            z = gate.readout(layer, h) if gate.probe == "lens" else None
            probes += 1
            if bool(gate.decide(layer, h, h_prev, z, at).all()):
                return StepResult(z if z is not None else gate.readout(layer, h), layer, probes, hs[layer][:, -1:])
        return StepResult(logits, adapter.num_layers, probes, None)

    @contextlib.contextmanager
    def stepping(self, state: StepState | None = None) -> Iterator[Stepper]:
        """Decode steps under the gate: hooks on the probed layers feed ``state`` (a fresh
        single-sequence ``StepState`` by default), plus RoPE capture for the K/V fill; all
        removed on leaving, also on error. Without a gate (or probes) nothing is installed."""
        state = StepState() if state is None else state
        if self.gate is None or not self.gate.probe_layers():
            yield Stepper(self, state, {})
            return
        layers = self.adapter.layers
        handles = [
            layers[layer - 1].register_forward_hook(self._hook(layer, state)) for layer in self.gate.probe_layers()
        ]
        try:
            with contextlib.ExitStack() as stack:
                rope = stack.enter_context(self.adapter.capture_rope()) if self.fast_fill else {}
                if self.kv_policy == "propagate" and not self.fast_fill:
                    stack.enter_context(self.adapter.filling(state))
                yield Stepper(self, state, rope)
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, layer: int, state: StepState):
        gate = self.gate
        lens_probe = gate.probe == "lens"
        unwind = self.unwind

        def after_layer(_module, args, output):
            if state.exit_layer is not None:  # kv_policy=full: already exited, layers run on for the cache
                return
            h = output[0] if isinstance(output, tuple) else output
            last, prev = h[:, -1], args[0][:, -1]
            z = gate.readout(layer, last) if lens_probe else None
            state.probes += 1
            if state.record(layer, h, z, gate.decide(layer, last, prev, z, state.at)):
                state.exit_layer = layer
                if unwind:
                    raise StepExit

        return after_layer


def _argmax(logits: torch.Tensor, index: int) -> torch.Tensor:
    return logits.argmax(-1, keepdim=True)


def greedy_decode(lm: LoadedModel, prompt_ids: Sequence[int], n_tokens: int) -> list[int]:
    """Full-depth greedy decoding of exactly ``n_tokens`` tokens (EOS does not stop it)."""
    return Engine(lm).generate(prompt_ids, n_tokens).tokens
