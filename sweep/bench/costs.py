"""The cost model of a loaded model (``cost_model``), measured: layers, heads, probes in situ, the K/V fill
and self-speculation's sublayers and verification passes, each a median of timed runs; its arithmetic,
what a decode step costs in layer-equivalents, is ``sweep.bench.pricing``."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import statistics
from typing import Callable, Sequence

import torch

from sweep import progress
from sweep.bench import costs_cache
from sweep.bench.pricing import CostModel, DecodeSteps, in_situ_key

__all__ = ["CostModel", "DecodeSteps", "cost_model", "in_situ_key"]
from sweep.config import GateConfig
from sweep.decode.engine import Engine, StepState
from sweep.decode.timing import Timer
from sweep.gates import FIRST, Decoding, Gate, make_gate
from sweep.gates.signals import logit_margin, saturation_delta
from sweep.models import LoadedModel, cache_dir

log = logging.getLogger("sweep.bench.costs")


@torch.inference_mode()
def _probes_alone(lm: LoadedModel, prompt_ids: Sequence[int]) -> tuple[float, float]:
    """ms of a lens probe (margin) and of a hidden probe (saturation) alone, on one position."""
    adapter, dev = lm.adapter, lm.device
    with progress.phase("cost model: probes alone", 2):
        token = torch.tensor([[int(prompt_ids[-1])]], device=dev)
        h = adapter.embed(token)[:, -1]
        h_prev = h * 0.9
        theta = torch.tensor(0.0)
        lens_ms = _median_ms(lambda: bool((logit_margin(adapter.lens(h)) >= theta).all()), dev)
        progress.step()
        hidden_ms = _median_ms(lambda: bool((saturation_delta(h, h_prev) < 0.1).all()), dev)
        progress.step()
    return lens_ms, hidden_ms


def _probed_engine(lm: LoadedModel, gate: Gate, ids: torch.Tensor) -> tuple[Engine, _ProbeOnly] | None:
    """An engine under ``gate``'s rule and readouts, deciding after every layer but the last, and the step
    state its timed steps use, calibrated on the prompt as a gated run is; None for a one-layer model."""
    probed = gate.probing_from(1)
    if not probed.probe_layers():
        return None
    # the policy gated runs use (a model without a K/V fill runs them under full); the state never exits
    engine = Engine(lm, probed, "propagate" if lm.adapter.kv_path is not None else "full")
    _, _, at, _ = engine.gated_prefill(ids, lm.adapter.new_cache(), n_tokens=2)  # a gate that calibrates does
    return engine, _ProbeOnly(dataclasses.replace(at, token=1))


def _probe_fraction(probed: list[float], full: list[float], engine: Engine) -> float:
    """One decision as a fraction of a full-depth step: the median over rounds of probed / full ms
    of the same round, less one, per probed layer."""
    extra = statistics.median(p / f for p, f in zip(probed, full)) - 1.0
    return max(extra, 0.0) / len(engine.gate.probe_layers())


def _decision_alone_ms(lm: LoadedModel, gate: Gate, layer: int, at: Decoding) -> float:
    """ms of one decision of ``gate`` itself after ``layer`` on one position, alone: its readout when it
    probes a lens, its rule, and the device sync a step pays to read the decision. A step pays at least
    this much per probe, so it is the floor of the in-situ cost where timing noise hides a cheap probe."""
    with torch.inference_mode():
        h = lm.adapter.embed(torch.tensor([[1]], device=lm.device))[:, -1]
        h_prev = h * 0.9

        def decision():
            z = gate.readout(layer, h) if gate.probe == "lens" else None
            return bool(gate.decide(layer, h, h_prev, z, at).all())

        return _median_ms(decision, lm.device)


def _in_situ_ms(
    lm: LoadedModel, gate: Gate, made: tuple[Engine, _ProbeOnly], probed: list[float], full: list[float], step_ms: float
) -> float:
    """ms of one probe of ``gate`` in a step: its share of the probed rounds (``_probe_fraction``), never
    below its decision alone (``_decision_alone_ms``): a probe is never free because the clock missed it."""
    engine, state = made
    alone = _decision_alone_ms(lm, gate, engine.gate.probe_layers()[0], state.at)
    return max(_probe_fraction(probed, full, engine) * step_ms, alone)


def _translate_ms(lm: LoadedModel, gate: Gate) -> float:
    """ms of the tuned lens's translator alone on one position (an exit's cost, not a probe's)."""
    layer = min(max(gate.min_layer, 1), max(lm.num_layers - 1, 1))  # a layer with a translator
    with torch.inference_mode():
        h = lm.adapter.embed(torch.tensor([[1]], device=lm.device))[:, -1]
        return _median_ms(lambda: gate.readouts.translate(layer, h), lm.device)


class _ProbeOnly(StepState):
    """A step state whose gate decides after every probed layer and never exits: a full-depth step
    that pays its probes (the decision's device sync included) and nothing else."""

    def __init__(self, at: Decoding = FIRST) -> None:
        super().__init__()
        self.at = at

    def record(self, layer, h, z, decided) -> bool:
        bool(decided.all())
        return False


def _timed_steps(
    engines: dict, token: torch.Tensor, cache, repeats: int, device, *, states: dict | None = None
) -> dict[str, list[float]]:
    """ms of one decode step of each engine from a copy of the same prefilled cache, the engines
    interleaved in alternating order, round by round (one warm-up round first); ``states`` gives an
    engine its ``StepState``. One step per engine and round (benchmarks/RESULTS.md compares it with two
    consecutive steps)."""
    states = states or {}
    times: dict = {k: [] for k in engines}
    names = list(engines)
    for r in range(repeats + 1):
        for name in names if r % 2 == 0 else names[::-1]:
            engine, kv = engines[name], copy.deepcopy(cache)
            with engine.stepping(states.get(name)) as stepper, Timer(device) as clock:
                stepper.step(token, kv).logits.argmax(-1)  # the next token, as a decode loop takes it
            if r >= 1:
                times[name].append(clock.seconds * 1000)
        progress.step()
    return times


@torch.inference_mode()
def _measure_probe(lm: LoadedModel, prompt_ids: Sequence[int], gate: Gate, step_ms: float, repeats: int = 16) -> float:
    """ms of one decision of ``gate`` where a gated run pays it, for a gate that comes after its model was
    measured: full-depth steps that decide after every probed layer and never exit against plain steps in
    the same rounds (``_probe_fraction``, a fraction of ``step_ms``). A ratio within a round holds when the
    machine's speed drifts between rounds. Measured alone, a lens probe reads the lm_head from a warm cache
    and skips the layer hook; inside a step it pays both, as the engine does."""
    ids = torch.tensor([list(prompt_ids)], device=lm.device)
    made = _probed_engine(lm, gate, ids)
    if made is None:
        return 0.0
    probed, state = made
    cache = lm.adapter.new_cache()
    token = lm.adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    engines = {"full": Engine(lm), "probed": probed}
    with progress.phase(f"cost model: probe {in_situ_key(gate)}", repeats + 1):  # rounds
        times = _timed_steps(engines, token, cache, repeats, lm.device, states={"probed": state})
    return _in_situ_ms(lm, gate, made, times["probed"], times["full"], step_ms)


@torch.inference_mode()
def _measure(lm: LoadedModel, prompt_ids: Sequence[int], repeats: int, gates: Sequence[Gate] = ()) -> CostModel:
    """The model's costs; the probes of ``gates`` in situ in the same rounds (one plain full-depth
    engine serves the layer slope, the step and every probe's ratio)."""
    adapter, L, dev = lm.adapter, lm.num_layers, lm.device
    lo = max(1, L // 4)
    hi = max(lo + 1, (3 * L) // 4) if L > 1 else 1
    ids = torch.tensor([list(prompt_ids)], device=lm.device)
    made, first = {}, {}  # in_situ_key -> its probed engine and step state (None: no probes), its first gate
    for gate in gates:
        if gate.probe_key != "none" and in_situ_key(gate) not in made:
            made[in_situ_key(gate)] = _probed_engine(lm, gate, ids)
            first[in_situ_key(gate)] = gate
    probed = {key: m[0] if m is not None else None for key, m in made.items()}
    # the probed engines next to the plain one in every round (forward and reversed), as in rounds of their own
    engines = {"full": Engine(lm), **{("probed", key): e for key, e in probed.items() if e is not None}}
    if L > 1:  # steps that stop after lo and after hi layers, skipped layers left without K/V
        for layer in (lo, hi):
            engines[layer] = _fixed_engine(lm, layer, "none")
    prefill_ms = _median_ms(lambda: adapter.forward(ids, adapter.new_cache()), dev, n=5, warm=1)
    with adapter.capture_hidden() as hs:
        cache = adapter.new_cache()
        token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    h_all, z_final = hs[max(1, L // 2)], adapter.lens(hs[L]).float()
    del hs
    prefill_lens_ms = _median_ms(lambda: (adapter.lens(h_all).float() - z_final).abs().amax(dim=-1), dev, n=5, warm=1)
    states = {("probed", key): m[1] for key, m in made.items() if m is not None}
    rounds = "cost model: step rounds" + "".join(f", probe {key}" for _, key in sorted(states, key=str))
    with progress.phase(rounds, repeats + 1):
        times = _timed_steps(engines, token, cache, repeats, dev, states=states)
    step_ms = statistics.median(times["full"])
    extra_probe_ms = {
        key: 0.0 if m is None else _in_situ_ms(lm, first[key], m, times[("probed", key)], times["full"], step_ms)
        for key, m in made.items()
    }
    h = adapter.embed(token)[:, -1]
    head_ms = _median_ms(lambda: adapter.lens(h), dev)
    if L > 1:
        # paired within rounds, as the probes are: the slope holds when the machine's speed drifts between rounds
        layer_ms = statistics.median(b - a for a, b in zip(times[lo], times[hi])) / (hi - lo)
    else:
        layer_ms = step_ms - head_ms
    # a noisy slope must not predict a full-depth step dearer than the one measured
    layer_ms = min(max(layer_ms, 1e-6), max(step_ms - head_ms, 1e-6) / L)
    overhead_ms = max(step_ms - L * layer_ms - head_ms, 0.0)
    return CostModel(
        layer_ms,
        head_ms,
        None,  # the probes alone: on demand (``_probes_alone``)
        None,
        None,
        overhead_ms,
        step_ms,
        L,
        prefill_ms=prefill_ms,
        prefill_lens_ms=prefill_lens_ms,
        prompt_tokens=len(prompt_ids),
        extra_probe_ms=extra_probe_ms,
    )


def _fixed_engine(lm: LoadedModel, layer: int, kv_policy: str) -> Engine:
    """An engine whose every decode step exits after ``layer`` (1-indexed) under ``kv_policy``."""
    return Engine(lm, make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=layer), lm), kv_policy)


@torch.inference_mode()
def _measure_kv(lm: LoadedModel, prompt_ids: Sequence[int], repeats: int) -> float:
    """ms of one skipped layer's K/V fill on the path the engine takes. Fast path: the stacked projection
    of the layers from L/4 on, timed alone. Generic path: in situ, steps exiting after layer L/4 with the
    fill (kv_policy=propagate) against the same steps without it (none), paired within rounds."""
    adapter, L, dev = lm.adapter, lm.num_layers, lm.device
    lo = max(1, L // 4)
    if L <= 1 or lo >= L:
        return 0.0
    ids = torch.tensor([list(prompt_ids)], device=dev)
    cache = adapter.new_cache()
    token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    skipped = range(lo, L)
    if adapter.kv_path == "fast":
        h = adapter.embed(token)
        with adapter.capture_rope() as rope:
            adapter.forward(token, copy.deepcopy(cache))
        copies = [copy.deepcopy(cache) for _ in range(5)]
        return _median_ms(lambda: adapter.fill_kv(h, copies.pop(), skipped, rope), dev, n=5, warm=0) / len(skipped)
    engines = {"fill": _fixed_engine(lm, lo, "propagate"), "none": _fixed_engine(lm, lo, "none")}
    with progress.phase("cost model: K/V fill rounds", repeats + 1):
        times = _timed_steps(engines, token, cache, repeats, dev)
    return max(statistics.median(f - n for f, n in zip(times["fill"], times["none"])), 0.0) / len(skipped)


@torch.inference_mode()
def _measure_speculation(lm: LoadedModel, prompt_ids: Sequence[int], costs: CostModel, positions: int, repeats: int):
    """Self-speculation's costs, interleaved in rounds from copies of one prefilled cache: a full-depth
    decode step against the same step with every attention sublayer (then every MLP, every state-space mixer)
    bypassed, for one sublayer's cost of each kind; a verification pass over k = 2..``positions`` positions."""
    from sweep.gates.skipset import SkipSet

    adapter, L, dev = lm.adapter, lm.num_layers, lm.device
    ids = torch.tensor([list(prompt_ids)], device=dev)
    cache = adapter.new_cache()
    token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    having = {k: frozenset(i + 1 for i in range(L) if k in adapter.sublayers(i)) for k in ("a", "m", "s")}
    bypass = {
        name: skip
        for name, skip in (
            ("attn", SkipSet(attention=having["a"])),
            ("mlp", SkipSet(mlp=having["m"])),
            ("mixer", SkipSet(mixer=having["s"])),
        )
        if len(skip)
    }

    def step(skip=None):
        kv = copy.deepcopy(cache)
        with contextlib.ExitStack() as stack:
            if skip is not None:
                stack.enter_context(adapter.bypassing(skip))
            with Timer(dev) as clock:
                adapter.forward(token, kv, position_ids=torch.tensor([[ids.shape[1]]], device=dev))[:, -1].argmax(-1)
        return clock.seconds * 1000

    def verify(k):
        kv = copy.deepcopy(cache)
        with Timer(dev) as clock:
            adapter.forward(token.repeat(1, k), kv, logits_to_keep=0)[0].argmax(-1)
        return clock.seconds * 1000

    jobs = {"full": step, **{name: (lambda skip=skip: step(skip)) for name, skip in bypass.items()}}
    jobs.update({k: (lambda k=k: verify(k)) for k in range(2, positions + 1)})
    times: dict = {name: [] for name in jobs}
    names = list(jobs)
    for r in range(repeats + 1):  # one warm-up round first
        for name in names if r % 2 == 0 else names[::-1]:
            ms = jobs[name]()
            if r >= 1:
                times[name].append(ms)
    full = times["full"]

    def each(name: str) -> float | None:  # one sublayer's ms: the step's saving over the layers that have it
        if name not in bypass:
            return None
        return max(statistics.median(f - b for f, b in zip(full, times[name])), 0.0) / len(bypass[name])

    costs.attn_ms, costs.mlp_ms, costs.mixer_ms = each("attn") or 0.0, each("mlp") or 0.0, each("mixer")
    costs.verify_ms = [statistics.median(full)] + [statistics.median(times[k]) for k in range(2, positions + 1)]


def _median_ms(fn: Callable[[], object], device: torch.device, *, n: int = 30, warm: int = 3) -> float:
    """Median ms of ``n`` synchronised calls of ``fn`` after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    samples, clock = [], Timer(device)
    for _ in range(n):
        with clock:
            fn()
        samples.append(clock.seconds * 1000)
    return statistics.median(samples)


def cost_model(
    lm: LoadedModel,
    prompt_ids: Sequence[int],
    *,
    gates: Sequence[Gate] = (),
    repeats: int = 16,
    kv_policies: Sequence[str] = ("propagate",),
    verify_positions: int = 0,
    probes_alone: bool | None = None,
) -> CostModel:
    """The cost model of ``lm`` on its device at this prompt's length, measured once per loaded
    model (kept with it: a model the model cache evicted takes its costs along, never leaving
    them to a later model); the probe of each of ``gates`` is measured too, in situ, once per
    ``in_situ_key`` (and a tuned lens's translator once): in the model's own rounds when it is
    measured with them, in rounds of its own for a gate that comes later. The K/V fill is measured
    once a kv_policy=propagate trial whose gate can exit asks for it (``kv_policies``), by the path
    the engine takes: none under kv_policy=full, none for gate=full; self-speculation's costs
    (sublayers, verification passes of up to ``verify_positions`` positions) once a trial asks for
    them. The lens and hidden probes alone (what a gate not measured in situ is charged) once
    ``probes_alone`` asks (None: when no gates are given). A gate without a probe (full, fixed)
    measures no probe at all."""
    with progress.phase("cost model", part="cost model"):
        # a loaded model has one device and dtype: its prompt length is all the key needs
        key, path = costs_cache.key(lm, len(prompt_ids)), costs_cache.path_for(cache_dir(), lm, len(prompt_ids))
        made: list[CostModel] = []  # what this call measured or took from the cache (nothing: kept in memory)
        costs = lm.adapter.derived(
            ("cost_model", len(prompt_ids)),
            lambda: made.append(_kept_or_measured(lm, prompt_ids, repeats, gates, path, key)) or made[0],
        )
        before = _snapshot(costs)
        exits = not gates or any(len(gate.probe_layers()) for gate in gates)

        def part(measure: Callable[[], object]) -> None:  # sets a part; once more where it alone does not fit
            costs_cache.coherent(lambda: measure() or costs, costs_cache.holds_together(costs) is None)

        if "propagate" in kv_policies and exits and costs.kv_ms is None and lm.adapter.kv_path is not None:
            part(lambda: setattr(costs, "kv_ms", _measure_kv(lm, prompt_ids, repeats)))
        if (not gates if probes_alone is None else probes_alone) and costs.lens_probe_ms is None:
            alone = ("lens_probe_ms", "hidden_probe_ms")
            part(lambda: vars(costs).update(zip(alone, _probes_alone(lm, prompt_ids))))
        if verify_positions > len(costs.verify_ms):
            part(lambda: _measure_speculation(lm, prompt_ids, costs, verify_positions, repeats))
        for gate in gates:
            probed = in_situ_key(gate)
            if gate.probe_key != "none" and probed not in costs.extra_probe_ms:
                probe = functools.partial(_measure_probe, lm, prompt_ids, gate, costs.step_ms)
                part(lambda: costs.extra_probe_ms.__setitem__(probed, probe()))
            if gate.cfg.lens == "tuned" and "translate" not in costs.extra_probe_ms:
                translate = functools.partial(_translate_ms, lm, gate)
                part(lambda: costs.extra_probe_ms.__setitem__("translate", translate()))
        if (made and costs.source == "fresh") or _snapshot(costs) != before:  # measured now: kept for the machine
            costs_cache.save(path, key, costs)
        return costs


def _snapshot(costs: CostModel) -> str:
    return json.dumps(costs.as_dict(), sort_keys=True, default=str)


def _kept_or_measured(lm: LoadedModel, prompt_ids, repeats: int, gates, path, key) -> CostModel:
    """This machine's cached cost model of ``lm`` at this prompt length when its check holds
    (``sweep.bench.costs_cache``), else the model measured now."""
    cached = costs_cache.load(path, key, lm.num_layers)
    if cached is not None:
        holds, now, floor = costs_cache.still_holds(cached, _check_steps(lm, prompt_ids))
        if holds:
            cached.source = "cached"
            return cached
        log.info(
            "cost model cache %s: a full-depth step now takes %.3f ms, %.3f ms when cached (%s): measuring afresh",
            *(path, now, cached.step_ms, costs_cache.why_not_held(floor)),
        )
    return costs_cache.coherent(lambda: _measure(lm, prompt_ids, repeats, gates))


@torch.inference_mode()
def _check_steps(lm: LoadedModel, prompt_ids: Sequence[int]) -> dict[str, list[float]]:
    """The cache's check: full-depth decode steps in two interleaved halves (``costs_cache.still_holds``)."""
    ids = torch.tensor([list(prompt_ids)], device=lm.device)
    cache = lm.adapter.new_cache()
    token = lm.adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    with progress.phase("cost model: check of the cached costs", costs_cache.CHECK_ROUNDS + 1):
        return _timed_steps({"a": Engine(lm), "b": Engine(lm)}, token, cache, costs_cache.CHECK_ROUNDS, lm.device)
