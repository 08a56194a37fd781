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
from dataclasses import dataclass
from typing import Any, Callable

from sweep import progress
from sweep.config import Config
from sweep.bench.costs import CostModel, DecodeSteps, cost_model
from sweep.bench.estimators import Timings
from sweep.gates import Gate
from sweep.models import LoadedModel
from sweep.models.prompts import Prompt
from sweep.bench.metrics import prompt_agreement
from sweep.bench.sides import References, gated_engine, lighten, sides, task_columns, timed_shares, verify_positions
from sweep.bench.rows import measured_row, stopped_row
from sweep.bench.reuse import Reference, ReferenceKey, ReuseCache, new_reference_id

log = logging.getLogger("sweep.bench.protocol")


SELF_CHECK_RUNS = 2  # untimed full-depth runs of each unit the determinism self-check makes
WARM_UP_AND_SELF_CHECK = "warm-up and self-check"  # a part of the time breakdown (``sweep.progress``)
PHASES = ("warm-up", "reference", "cost model", "round")  # the phases a trial's events name, in this order


@dataclass(frozen=True)
class Rungs:
    """Early stopping inside a group (``search.min_agreement``): the first timed round runs the units of every
    setting in order, and after its first ``first`` prompts, then twice as many, ... (short of all of them),
    ``check(setting, agreement)`` with the setting's per-prompt agreement so far returns None (it goes on) or the
    bound that stops it (the upper end of its agreement's interval, below the bar). A stopped setting decodes no
    further; the others keep the group's shared baseline and lose nothing (the runs checked are their gated
    references, timed as without stopping). Whoever gives the check decides: the bench only asks."""

    first: int
    check: Callable[[int, list[float]], float | None]


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
        both = [sides(c, lm, g, prompts) for c, g in zip(cfgs, gates)]
        self.units, self.baseline = both[0][0], both[0][1]
        self.gated = [side[2] for side in both]
        self.on_event = on_event
        self.spent = [0.0] * len(cfgs)  # each setting's own gated seconds in the timed rounds

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

    def references(self) -> tuple[References, str, bool]:
        """The full-depth references from the source, or taken now (the determinism self-check: two
        baselines per unit with the same tokens and, for single sequences, their max logit difference)
        and kept there when they pass. Their gated list is left empty: the first timed round fills it."""
        ref = self.source.get(self.key)
        if ref is not None:
            return References(self.units, baseline=list(ref.baseline), max_logit_diff=ref.max_logit_diff), ref.id, True
        self.source.counts["self_checks"] += 1
        refs = References(self.units, max_logit_diff=None if self.baseline.batched else 0.0)
        shown = progress.start("self-check", len(self.units), part=WARM_UP_AND_SELF_CHECK)  # one step per unit
        for i, unit in enumerate(self.units):
            first, second = self.baseline.run(unit, record=True), self.baseline.run(unit, record=True)
            self.emit("reference", "baseline", unit=i)
            if first.tokens != second.tokens:
                refs.deterministic = False
                log.warning("determinism self-check failed on %s: two full-depth baselines differ", _ids(unit))
            if refs.max_logit_diff is not None:
                refs.max_logit_diff = max(refs.max_logit_diff, float((first.logits - second.logits).abs().max()))
            lighten(first)
            refs.baseline.append(first)
            shown.advance()
        shown.close()
        reference_id = new_reference_id(self.key)
        if refs.deterministic:
            self.source.put(Reference(self.key, reference_id, list(refs.baseline), refs.max_logit_diff))
        return refs, reference_id, False

    def rounds(
        self, shared: References, stopping: Rungs | None = None
    ) -> tuple[list[References], list[Timings], list[bool], dict[int, tuple[list[float], float]]]:
        """Decode and prefill seconds [round][unit] per setting: per round and unit the baseline, each
        gated side in turn and the A/A control (a second full-depth run), forward when round + unit is
        even, else reversed, so the baseline and the A/A swap ends; each setting's Timings carry the
        baseline and the A/A timed in the same rounds. Whether every timed run reproduced its reference
        tokens (each gated side's first timed run of a unit is its reference). With ``stopping``, the first
        round's units are its rungs: after its first units (``Rungs.first`` prompts), then twice as many, ... (short
        of all of them), each setting still running is checked on its gated references so far; one that stops
        decodes no further (its partial timings are dropped), and the stopped settings come back: index ->
        (per-prompt agreement, bound)."""
        repeats, units = self.cfgs[0].bench.repeats, self.units
        refs = [
            References(units, list(shared.baseline), [], shared.deterministic, shared.max_logit_diff)
            for _ in self.gated
        ]
        timings = [Timings.empty(repeats, len(units)) for _ in self.gated]
        base_ok, gated_ok = True, [True] * len(self.gated)
        live, stopped = list(range(len(self.gated))), {}
        rung = -(-stopping.first // self.cfgs[0].bench.batch_size) if stopping is not None else len(units)
        shown = progress.start("timed rounds", repeats * len(units), part="timed rounds")  # a step per round and unit
        for r in range(repeats):
            for i, unit in enumerate(units):
                order = ["baseline", *live, "aa"]
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
                    self.spent[s] += gen.decode_seconds + gen.prefill_seconds
                shown.advance()
                if r == 0 and i + 1 == rung < len(units):  # a rung: a setting that cannot reach the bar stops here
                    stopped.update(self.checked(live, refs, stopping))
                    live, rung = [s for s in live if s not in stopped], rung * 2
                if not live:
                    break
            if not live:
                break
        shown.close()
        reproduced = [base_ok and ok for ok in gated_ok]
        if not all(ok for s, ok in enumerate(reproduced) if s not in stopped):
            log.warning("a timed repeat did not reproduce its reference tokens")
        return refs, timings, reproduced, stopped

    def checked(self, live: list[int], refs: list[References], stopping: Rungs) -> dict:
        """A rung's check of each setting still running, on its gated references so far: those it stops, each with
        (per-prompt agreement, bound)."""
        out = {}
        for s in live:
            k = len(refs[s].gated)
            part = References(self.units[:k], refs[s].baseline[:k], refs[s].gated)
            agreement = prompt_agreement(part.prompt_runs(self.baseline, self.gated[s]))
            bound = stopping.check(s, agreement)
            if bound is not None:
                out[s] = (agreement, bound)
        return out


def run_trials(
    cfgs: list[Config],
    lm: LoadedModel,
    gates: list[Gate],
    prompts: list[Prompt],
    references: ReuseCache | None = None,
    on_event: Callable[[PhaseEvent], None] | None = None,
    rungs: Rungs | None = None,
) -> list[dict[str, Any]]:
    """The protocol of every trial: gated settings of one model measured against one full-depth baseline
    per round (a trial alone is a group of one). Warm-up; the cost model; the full-depth references
    from ``references`` (the injected reference source: a sweep worker's cache, ``sweep.bench.reuse``,
    or None for fresh ones taken here), with their determinism self-check when they are taken; with ``rungs``,
    the early-stop checks (``Rungs``: a setting stopped there decodes no further, its row ``stopped``); the
    interleaved timed rounds with the A/A control; one row per setting, in order, its speedup against the
    baseline timed in the same rounds. The settings must share what the reference depends on
    (``ReferenceKey``: model, prompts, gen_tokens, seed, batch_size) and bench.repeats; gate, kv_policy
    and mode may differ. The group's wall time (and its setup, the untimed work before the timed
    rounds) is apportioned to the measured rows by the seconds each setting's timed rounds took
    (``timed_shares``); a stopped setting's is its own runs' and an even share of the group's time before them.
    ``on_event`` is called with each ``PhaseEvent``, in the order they happen."""
    t_start = time.perf_counter()
    source = references if references is not None else ReuseCache()  # fresh: a private source
    run = _Protocol(cfgs, lm, gates, prompts, source, on_event)
    run.warm_up()
    costs = run.cost_model()
    shared, reference_id, reused = run.references()
    setup = time.perf_counter() - t_start
    refs, timings, reproduced, stopped = run.rounds(shared, rungs)
    rows: list = [None] * len(cfgs)
    for s, (agreement, bound) in stopped.items():  # its own gated runs, and an even share of the setup
        rows[s] = stopped_row(cfgs[s], gates[s], agreement, bound, run.spent[s] + setup / len(cfgs))
    live = [s for s in range(len(cfgs)) if s not in stopped]
    if not live:
        return rows
    if not all(reproduced[s] for s in live):
        source.drop(run.key)  # the worker no longer reproduces it: the next trial re-runs the self-check
    spent = sum(rows[s]["bench_seconds"] for s in stopped)  # the stopped settings' time
    wall, setup = time.perf_counter() - t_start - spent, setup * len(live) / len(cfgs)
    shares = timed_shares([timings[s] for s in live])
    for s, w in zip(live, shares):
        gate, side, ref = gates[s], run.gated[s], refs[s]
        rows[s] = measured_row(
            cfgs[s],
            lm,
            gate,
            costs,
            ref.prompt_runs(run.baseline, side),
            timings[s],
            steps=DecodeSteps.of_batches(ref.gated) if side.batched else None,
            deterministic=ref.deterministic and reproduced[s],
            max_logit_diff=ref.max_logit_diff,
            reference=(reference_id, reused, "fresh" if references is None else "cached"),
            seconds=(wall * w, setup * w),
            share=len(live),
        )
        if cfgs[s].eval.task is not None:  # the task's accuracy, gated and at full depth (sweep.tasks.evaluate)
            rows[s].update(task_columns(cfgs[s], lm, gated_engine(cfgs[s], lm, gate), source.tasks))
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
