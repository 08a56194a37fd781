"""A trial's two sides and what they share: how the full-depth baseline and a gated setting each run a unit (one
prompt, or a batch), the reference runs every timed run must reproduce, the gated engine a setting measures, and how
a group's time is shared out (``sweep.bench.protocol`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweep.config import Config
from sweep.decode.engine import Decoded, Engine
from sweep.bench.estimators import Timings
from sweep.gates import Gate
from sweep.models import LoadedModel
from sweep.models.prompts import Prompt
from sweep.bench.metrics import PromptRun


@dataclass
class Side:
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
class References:
    """A trial's reference runs per unit: the first full-depth baseline and the gated run,
    which every timed run must reproduce; whether the two baselines agreed; their max logit
    difference (None for batches, whose self-check compares tokens only)."""

    units: list[list[Prompt]]
    baseline: list[Any] = field(default_factory=list)
    gated: list[Any] = field(default_factory=list)
    deterministic: bool = True
    max_logit_diff: float | None = 0.0

    def prompt_runs(self, baseline: Side, gated: Side) -> list[PromptRun]:
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


def sides(cfg: Config, lm: LoadedModel, gate: Gate, prompts: list[Prompt]) -> tuple[list[list[Prompt]], Side, Side]:
    """The trial's units and its two sides: each prompt alone against ``gated_engine``, or
    (bench.batch_size > 1) whole batches of consecutive prompts under the batch engine."""
    b = cfg.bench
    if b.batch_size == 1:
        return [[p] for p in prompts], Side(Engine(lm), b.gen_tokens), Side(gated_engine(cfg, lm, gate), b.gen_tokens)
    from sweep.decode.batching import BatchEngine, batches

    units = batches(prompts, b.batch_size)
    baseline, gated = BatchEngine(lm), BatchEngine(lm, gate, b.kv_policy)
    return units, Side(baseline, b.gen_tokens, batched=True), Side(gated, b.gen_tokens, batched=True)


def lighten(record) -> None:
    """Drop what served the self-check (vocab-sized logits, hidden states, the KV cache): a
    trial, and a reused reference, keep tokens and exits."""
    if getattr(record, "logits", None) is not None:
        record.logits = None
    if getattr(record, "exit_hidden", None):
        record.exit_hidden = []
    if getattr(record, "cache", None) is not None:
        record.cache = None


def task_columns(cfg: Config, lm: LoadedModel, engine, cache) -> dict[str, Any]:
    """A task's accuracy under the gate (``engine``) and at full depth, with the intervals of their scores (none for
    a gated side stopped early by search.max_accuracy_loss)."""
    from sweep.bench.estimators import task_intervals
    from sweep.config.identity import trial_columns
    from sweep.tasks.evaluate import evaluate

    out = evaluate(cfg, lm, engine, cache)
    trial_id = trial_columns(cfg)["trial_id"]
    stopped = out["accuracy_loss_min"] is not None  # a side stopped early: intervals over its first problems mislead
    scores = [] if stopped else out["task_scores"]
    full = out["task_scores_full"][: len(scores)]
    out.update(task_intervals(scores, full, trial_id, cfg.analysis.n_boot, cfg.analysis.seed))
    return out
