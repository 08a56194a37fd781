"""The deterministic early-exit bench: one protocol for every trial (``run_trials``; a trial alone
is a group of one).

Warm-up (the self-check's untimed baselines count towards the baseline's); the cost model, on the
warmed model; the full-depth references from the injected reference source: taken fresh, with the
determinism self-check (two full-depth baselines per unit must give identical tokens, their max logit
difference is recorded), or a sweep worker's cached ones (``sweep.bench.reuse``); then timing of the
baseline and every gated setting interleaved over repeats, with an A/A control (full depth timed again
in the same rounds: the trial's noise floor). The first timed round's gated run of a unit is the
gated reference; every later timed run must reproduce its reference's tokens. Then agreement, exits,
wall-clock and cost-model speedups (``sweep.bench.rows``). A trial that fails the self-check or a
reproduction is ``nondeterministic`` and never ``ok``. Each step is a public ``PhaseEvent``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sweep import progress
from sweep.config import Config
from sweep.bench.costs import CostModel, DecodeSteps, cost_model
from sweep.decode.engine import Decoded, Engine
from sweep.bench.estimators import Timings
from sweep.gates import Gate
from sweep.models import LoadedModel
from sweep.models.prompts import Prompt
from sweep.bench.metrics import PromptRun, prompt_agreement
from sweep.bench.rows import measured_row
from sweep.bench.reuse import Reference, ReferenceKey, ReuseCache, new_reference_id

log = logging.getLogger("sweep.bench.protocol")


@dataclass
class _Side:
    """One side of a trial (full-depth baseline or gated) and how it runs a unit: one prompt
    alone, or a batch of consecutive prompts decoded together (``batched``)."""

    engine: Any  # Engine or SelfSpeculative; BatchEngine when batched
    n: int  # tokens per run
    batched: bool = False

    def run(self, unit: list[Prompt], record: bool = False):
        """A fresh run of ``unit``; ``record`` keeps a single sequence's logits (the self-check's)."""
        if self.batched:
            return self.engine.generate_batch([p.input_ids for p in unit], self.n)
        if record:
            return self.engine.generate(unit[0].input_ids, self.n, record=True)
        return self.engine.generate(unit[0].input_ids, self.n)

    def records(self, run) -> list[Decoded]:
        """A run's per-prompt records, in the unit's order."""
        return run.rows() if self.batched else [run]


@dataclass
class _References:
    """A trial's reference runs per unit: the first full-depth baseline and the gated run,
    which every timed run must reproduce; whether the two baselines agreed; their max logit
    difference (None for batches, whose self-check compares tokens only)."""

    units: list[list[Prompt]]
    baseline: list[Any] = field(default_factory=list)
    gated: list[Any] = field(default_factory=list)
    deterministic: bool = True
    max_logit_diff: float | None = 0.0

    def prompt_runs(self, baseline: _Side, gated: _Side) -> list[PromptRun]:
        return [
            PromptRun(prompt, base, gate)
            for unit, b, g in zip(self.units, self.baseline, self.gated)
            for prompt, base, gate in zip(unit, baseline.records(b), gated.records(g))
        ]


def gated_engine(cfg: Config, lm: LoadedModel, gate: Gate):
    """What the trial measures against full depth: early exit under the gate, or lossless
    self-speculation drafting with the fixed gate's layers or the skip gate's skip set."""
    if cfg.bench.mode == "self_speculative":
        from sweep.decode.speculative import SelfSpeculative, drafter_for  # validate(): the gate is fixed or skip

        return SelfSpeculative(lm, drafter_for(lm, gate), cfg.bench.draft_len, cfg.bench.draft_stop)
    return Engine(lm, gate, cfg.bench.kv_policy)


def verify_positions(cfgs: list[Config]) -> dict[str, int]:
    """The cost model's verification passes self-speculative settings need: up to draft_len + 1 positions."""
    spec = [c.bench.draft_len + 1 for c in cfgs if c.bench.mode == "self_speculative"]
    return {"verify_positions": max(spec)} if spec else {}


def timed_shares(timings: list[Timings]) -> list[float]:
    """Each setting's share of a shared group's time: the seconds of its own gated runs plus an even
    share of the baseline's and the A/A control's, over the group's timed seconds (the shares sum to 1)."""

    def total(*grids) -> float:
        return sum(v for grid in grids for row in grid for v in row)

    t0 = timings[0]  # the baseline and the A/A control are shared: an even share of them each
    base = total(t0.base_decode, t0.base_prefill, t0.aa_decode, t0.aa_prefill) / len(timings)
    own = [base + total(t.gated_decode, t.gated_prefill) for t in timings]
    whole = sum(own)
    return [o / whole if whole > 0 else 1 / len(own) for o in own]


def _sides(cfg: Config, lm: LoadedModel, gate: Gate, prompts: list[Prompt]) -> tuple[list[list[Prompt]], _Side, _Side]:
    """The trial's units and its two sides: each prompt alone against ``gated_engine``, or
    (bench.batch_size > 1) whole batches of consecutive prompts under the batch engine."""
    b = cfg.bench
    if b.batch_size == 1:
        return [[p] for p in prompts], _Side(Engine(lm), b.gen_tokens), _Side(gated_engine(cfg, lm, gate), b.gen_tokens)
    from sweep.decode.batching import BatchEngine, batches

    units = batches(prompts, b.batch_size)
    baseline, gated = BatchEngine(lm), BatchEngine(lm, gate, b.kv_policy)
    return units, _Side(baseline, b.gen_tokens, batched=True), _Side(gated, b.gen_tokens, batched=True)


def _lighten(record) -> None:
    """Drop what served the self-check (vocab-sized logits, hidden states, the KV cache): a
    trial, and a reused reference, keep tokens and exits."""
    if getattr(record, "logits", None) is not None:
        record.logits = None
    if getattr(record, "exit_hidden", None):
        record.exit_hidden = []
    if getattr(record, "cache", None) is not None:
        record.cache = None


SELF_CHECK_RUNS = 2  # untimed full-depth runs of each unit the determinism self-check makes
WARM_UP_AND_SELF_CHECK = "warm-up and self-check"  # a part of the time breakdown (``sweep.progress``)
PHASES = ("warm-up", "reference", "cost model", "round")  # the phases a trial's events name, in this order


@dataclass(frozen=True)
class PhaseEvent:
    """One step of the protocol, as ``run_trials`` reports it to ``on_event``: ``phase`` (``PHASES``),
    the side that ran (``baseline``, ``gated`` or ``aa``, the A/A control's second full-depth run; None
    for the cost model), the setting of a group (0-based; None for full-depth runs), the unit (a prompt
    or a batch, 0-based) and the timed round (0-based; None outside the rounds)."""

    phase: str
    side: str | None = None
    setting: int | None = None
    unit: int | None = None
    round: int | None = None


class _Protocol:
    """One trial group's run of the protocol: its sides, its reference source and its events."""

    def __init__(self, cfgs, lm, gates, prompts, source: ReuseCache, on_event) -> None:
        keys = {
            ReferenceKey.of(lm, prompts, gen_tokens=c.bench.gen_tokens, seed=c.seed, batch_size=c.bench.batch_size)
            for c in cfgs
        }
        if not cfgs or len(keys) != 1 or len({c.bench.repeats for c in cfgs}) != 1 or len(gates) != len(cfgs):
            raise ValueError(
                "shared-baseline settings must share model, prompts, gen_tokens, seed, batch_size, repeats"
            )
        self.cfgs, self.lm, self.gates, self.source, self.key = cfgs, lm, gates, source, keys.pop()
        sides = [_sides(c, lm, g, prompts) for c, g in zip(cfgs, gates)]
        self.units, self.baseline = sides[0][0], sides[0][1]
        self.gated = [side[2] for side in sides]
        self.on_event = on_event

    def emit(self, phase: str, side: str | None = None, setting=None, unit=None, round=None) -> None:
        if self.on_event is not None:
            self.on_event(PhaseEvent(phase, side, setting, unit, round))

    def warm_up(self) -> None:
        """Warm-up before the cost model and the self-check: the baseline once per key (what a self-check
        still to come leaves of bench.warmup), each gated side once per key and gate kind (probe, mode,
        kv_policy, draft_len)."""
        lm, key, source = self.lm, self.key, self.source
        with progress.phase("warm-up", part=WARM_UP_AND_SELF_CHECK):  # one step per run
            if source.needs_warmup((key, id(lm.adapter), "baseline")):
                warmup = self.cfgs[0].bench.warmup
                for _ in range(max(warmup - SELF_CHECK_RUNS, 0) if source.peek(key) is None else warmup):
                    self.baseline.run(self.units[0])
                    self.emit("warm-up", "baseline", unit=0)
                    progress.step()
            for k, (cfg, gate, side) in enumerate(zip(self.cfgs, self.gates, self.gated)):
                b = cfg.bench
                kind = (gate.probe_key, b.mode, b.kv_policy, b.draft_len if b.mode == "self_speculative" else None)
                if source.needs_warmup((key, id(lm.adapter), "gated", *kind)):
                    for _ in range(b.warmup):
                        side.run(self.units[0])
                        self.emit("warm-up", "gated", k, 0)
                        progress.step()

    def cost_model(self) -> CostModel:
        """The cost model, every setting's probe in the same rounds."""
        cfgs = self.cfgs
        costs = cost_model(
            self.lm,
            self.units[0][0].input_ids,
            gates=self.gates,
            kv_policies=[c.bench.kv_policy for c in cfgs],
            **verify_positions(cfgs),
        )
        self.emit("cost model")
        return costs

    def references(self) -> tuple[_References, str, bool]:
        """The full-depth references from the source, or taken now (the determinism self-check: two
        baselines per unit with the same tokens and, for single sequences, their max logit difference)
        and kept there when they pass. Their gated list is left empty: the first timed round fills it."""
        ref = self.source.get(self.key)
        if ref is not None:
            return _References(self.units, baseline=list(ref.baseline), max_logit_diff=ref.max_logit_diff), ref.id, True
        self.source.counts["self_checks"] += 1
        refs = _References(self.units, max_logit_diff=None if self.baseline.batched else 0.0)
        shown = progress.start("self-check", len(self.units), part=WARM_UP_AND_SELF_CHECK)  # one step per unit
        for i, unit in enumerate(self.units):
            first, second = self.baseline.run(unit, record=True), self.baseline.run(unit, record=True)
            self.emit("reference", "baseline", unit=i)
            if first.tokens != second.tokens:
                refs.deterministic = False
                log.warning("determinism self-check failed on %s: two full-depth baselines differ", _ids(unit))
            if refs.max_logit_diff is not None:
                refs.max_logit_diff = max(refs.max_logit_diff, float((first.logits - second.logits).abs().max()))
            _lighten(first)
            refs.baseline.append(first)
            shown.advance()
        shown.close()
        reference_id = new_reference_id(self.key)
        if refs.deterministic:
            self.source.put(Reference(self.key, reference_id, list(refs.baseline), refs.max_logit_diff))
        return refs, reference_id, False

    def rungs(self, shared: _References, first: int, check: Callable[[list[float]], None]) -> list:
        """A lone setting's gated runs of its first ``first`` units, then twice as many, ... (short of all of them),
        ``check`` given the per-prompt agreement so far at each (a sweep stops a hopeless setting there, and this
        call does not return). The runs, which the timed rounds must reproduce (their gated references)."""
        side, runs, k = self.gated[0], [], first
        while k < len(self.units):
            for i in range(len(runs), k):
                runs.append(side.run(self.units[i]))
                self.emit("rung", "gated", 0, i)
            part = _References(self.units[:k], shared.baseline[:k], runs)
            check(prompt_agreement(part.prompt_runs(self.baseline, side)))
            k *= 2
        return runs

    def rounds(
        self, shared: _References, gated: list | None = None
    ) -> tuple[list[_References], list[Timings], list[bool]]:
        """Decode and prefill seconds [round][unit] per setting: per round and unit the baseline, each
        gated side in turn and the A/A control (a second full-depth run), forward when round + unit is
        even, else reversed, so the baseline and the A/A swap ends; each setting's Timings carry the
        baseline and the A/A timed in the same rounds. Whether every timed run reproduced its reference
        tokens (each gated side's first timed run of a unit is its reference)."""
        repeats, units = self.cfgs[0].bench.repeats, self.units
        refs = [
            _References(units, list(shared.baseline), list(gated or []), shared.deterministic, shared.max_logit_diff)
            for _ in self.gated
        ]
        timings = [Timings.empty(repeats, len(units)) for _ in self.gated]
        base_ok, gated_ok = True, [True] * len(self.gated)
        shown = progress.start("timed rounds", repeats * len(units), part="timed rounds")  # a step per round and unit
        for r in range(repeats):
            for i, unit in enumerate(units):
                order = ["baseline", *range(len(self.gated)), "aa"]
                for s in order if (r + i) % 2 == 0 else reversed(order):
                    if s in ("baseline", "aa"):
                        gen = self.baseline.run(unit)
                        self.emit("round", s, unit=i, round=r)
                        base_ok &= gen.tokens == shared.baseline[i].tokens
                        for t in timings:
                            decode, prefill = (
                                (t.base_decode, t.base_prefill) if s == "baseline" else (t.aa_decode, t.aa_prefill)
                            )
                            decode[r][i], prefill[r][i] = gen.decode_seconds, gen.prefill_seconds
                        continue
                    gen, ref, t = self.gated[s].run(unit), refs[s], timings[s]
                    self.emit("round", "gated", s, i, r)
                    if i >= len(ref.gated):  # the first timed round's gated run is the gated reference
                        ref.gated.append(gen)
                    else:
                        gated_ok[s] &= gen.tokens == ref.gated[i].tokens
                    t.gated_decode[r][i], t.gated_prefill[r][i] = gen.decode_seconds, gen.prefill_seconds
                shown.advance()
        shown.close()
        reproduced = [base_ok and ok for ok in gated_ok]
        if not all(reproduced):
            log.warning("a timed repeat did not reproduce its reference tokens")
        return refs, timings, reproduced


def run_trials(
    cfgs: list[Config],
    lm: LoadedModel,
    gates: list[Gate],
    prompts: list[Prompt],
    references: ReuseCache | None = None,
    on_event: Callable[[PhaseEvent], None] | None = None,
    rung: tuple[int, Callable[[list[float]], None]] | None = None,
) -> list[dict[str, Any]]:
    """The protocol of every trial: gated settings of one model measured against one full-depth baseline
    per round (a trial alone is a group of one). Warm-up; the cost model; the full-depth references
    from ``references`` (the injected reference source: a sweep worker's cache, ``sweep.bench.reuse``,
    or None for fresh ones taken here), with their determinism self-check when they are taken; the
    interleaved timed rounds with the A/A control; one row per setting, its speedup against the
    baseline timed in the same rounds. The settings must share what the reference depends on
    (``ReferenceKey``: model, prompts, gen_tokens, seed, batch_size) and bench.repeats; gate, kv_policy
    and mode may differ. The group's wall time (and its setup, the untimed work before the timed
    rounds) is apportioned to the rows by the seconds each setting's timed rounds took
    (``timed_shares``). ``on_event`` is called with each ``PhaseEvent``, in the order they happen. ``rung``
    (a lone setting only): (prompts, check): before the timed rounds, its gated runs of the first prompts, then
    twice as many, ..., ``check`` given their per-prompt agreement each time (``_Protocol.rungs``)."""
    t_start = time.perf_counter()
    source = references if references is not None else ReuseCache()  # fresh: a private source
    run = _Protocol(cfgs, lm, gates, prompts, source, on_event)
    run.warm_up()
    costs = run.cost_model()
    shared, reference_id, reused = run.references()
    gated = None
    if rung is not None:
        if len(cfgs) != 1:
            raise ValueError("an early-stopped setting is timed alone (no shared baseline)")
        gated = run.rungs(shared, -(-rung[0] // cfgs[0].bench.batch_size), rung[1])
    setup = time.perf_counter() - t_start
    refs, timings, reproduced = run.rounds(shared, gated)
    if not all(reproduced):
        source.drop(run.key)  # the worker no longer reproduces it: the next trial re-runs the self-check
    wall, n = time.perf_counter() - t_start, len(cfgs)
    shares = timed_shares(timings)
    rows = []
    for cfg, gate, side, ref, t, ok, w in zip(cfgs, gates, run.gated, refs, timings, reproduced, shares):
        rows.append(
            measured_row(
                cfg,
                lm,
                gate,
                costs,
                ref.prompt_runs(run.baseline, side),
                t,
                steps=DecodeSteps.of_batches(ref.gated) if side.batched else None,
                deterministic=ref.deterministic and ok,
                max_logit_diff=ref.max_logit_diff,
                reference=(reference_id, reused, "fresh" if references is None else "cached"),
                seconds=(wall * w, setup * w),
                share=n,
            )
        )
    for cfg, gate, row in zip(cfgs, gates, rows):
        if cfg.eval.task is not None:  # the task's accuracy, gated and at full depth (sweep.tasks.evaluate)
            from sweep.bench.estimators import task_intervals
            from sweep.config.identity import trial_columns
            from sweep.tasks.evaluate import evaluate

            trial_id = trial_columns(cfg)["trial_id"]
            row.update(evaluate(cfg, lm, gated_engine(cfg, lm, gate), source.tasks))
            n_boot, seed = cfg.analysis.n_boot, cfg.analysis.seed
            stopped = row["accuracy_loss_min"] is not None  # intervals over its first problems would mislead
            scores = [] if stopped else row["task_scores"]
            row.update(task_intervals(scores, row["task_scores_full"][: len(scores)], trial_id, n_boot, seed))
    return rows


def run_trial(
    cfg: Config,
    lm: LoadedModel,
    gate: Gate,
    prompts: list[Prompt],
    references: ReuseCache | None = None,
    on_event: Callable[[PhaseEvent], None] | None = None,
) -> dict[str, Any]:
    """One setting measured alone: ``run_trials`` on a group of one."""
    return run_trials([cfg], lm, [gate], prompts, references, on_event)[0]


def _ids(unit: list[Prompt]) -> str:
    return ", ".join(p.id for p in unit)
