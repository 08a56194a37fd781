"""The deterministic early-exit bench: one trial of (model, gate, thresholds).

Warm-up (the self-check's untimed baselines count towards the baseline's); the cost model,
on the warmed model; the determinism self-check (two full-depth baselines must give identical
tokens, their max logit difference is recorded), which leads into the timed rounds as the
baseline's warm-up did; the gated run; timing of baseline and
gated decoding interleaved over repeats, with an A/A control (full depth timed again in the same
rounds: the trial's noise floor; every timed run must reproduce its tokens too); then agreement,
exits, wall-clock and cost-model speedups. A trial that fails
the self-check is ``nondeterministic`` and never ``ok``.

In a sweep worker (``run_trial(..., reuse=cache)``, see ``sweep.reuse``) the reference and
its self-check are taken once per model, prompts, token count, seed and batch size and
reused by the worker's later trials, warm-up runs once per such key and gate kind, and the
gated reference is the first timed round's gated run; each trial still checks every timed
baseline against the reference and every later gated round against its first. Rows name
their reference (``reference_id``, ``reference_reused``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sweep import progress
from sweep.config import Config
from sweep.costs import CostModel, DecodeSteps, cost_model
from sweep.engine import Decoded, Engine
from sweep.estimators import Timings
from sweep.gatespec import setting_columns
from sweep.gates import Gate, make_gate
from sweep.identity import trial_columns
from sweep.models import LoadedModel, load_model
from sweep.prompts import Prompt, read_prompts, tokenize_prompts
from sweep.trial_metrics import PromptRun, metrics, speculation
from sweep.reuse import Reference, ReferenceKey, ReuseCache, new_reference_id

log = logging.getLogger("sweep.bench")


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


def prepare(cfg: Config) -> tuple[LoadedModel, Gate, list[Prompt]]:
    """Load and check everything a trial needs; bad input fails here, before any work."""
    with progress.phase("load", part="load"):
        return _prepare(cfg)


def _prepare(cfg: Config) -> tuple[LoadedModel, Gate, list[Prompt]]:
    items = read_prompts(cfg.prompts)
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    gate = make_gate(cfg.gate, lm.num_layers, lm.adapter.config.hidden_size)  # the one check against the model
    speculative, exits = cfg.bench.mode == "self_speculative", bool(gate.probe_layers())
    lm.require(
        lens=exits or speculative,
        kv_policy=cfg.bench.kv_policy if exits else None,
        crop=speculative,
        batch_size=cfg.bench.batch_size,
    )
    room = getattr(lm.adapter.config, "max_position_embeddings", None)
    prompts = tokenize_prompts(
        items,
        cfg.prompts,
        lm.tokenizer,
        room=None if room is None else room - cfg.bench.gen_tokens,
        gen=("bench.gen_tokens", cfg.bench.gen_tokens),
    )
    attach_readouts(gate, cfg.gate, lm, prompts)
    return lm, gate, prompts


def attach_readouts(gate: Gate, gate_cfg, lm: LoadedModel, prompts: list[Prompt], key: str = "gate.readouts") -> None:
    """The fitted readouts a tuned lens or the classifier reads: loaded for this model (refused when
    fitted to another) and checked disjoint from the prompts it is evaluated on; nothing otherwise."""
    if gate_cfg.readouts is None:
        return
    from sweep.readouts import readouts_for

    gate.attach(readouts_for(gate_cfg.readouts, lm, prompts, key))


def gated_engine(cfg: Config, lm: LoadedModel, gate: Gate):
    """What the trial measures against full depth: early exit under the gate, or lossless
    self-speculation drafting with the fixed gate's layers or the skip gate's skip set."""
    if cfg.bench.mode == "self_speculative":
        from sweep.speculative import SelfSpeculative, drafter_for  # validate(): the gate is fixed or skip

        return SelfSpeculative(lm, drafter_for(lm, gate), cfg.bench.draft_len, cfg.bench.draft_stop)
    return Engine(lm, gate, cfg.bench.kv_policy)


def run_trial(
    cfg: Config, lm: LoadedModel, gate: Gate, prompts: list[Prompt], reuse: ReuseCache | None = None
) -> dict[str, Any]:
    """Measure one trial; returns the trial table's own columns (provenance aside). The same
    protocol for single sequences and batches: prepare the engines, warm up, the cost model, the
    reference runs (determinism self-check), the interleaved timed rounds, the metrics.

    With ``reuse`` (a sweep worker's ``sweep.reuse`` cache) the full-depth reference and its
    self-check are taken once per ``ReferenceKey`` and reused by later trials of the key, warm-up
    runs once per key and gate kind, and the gated reference is the first timed round's gated run
    (later rounds must reproduce it); every timed baseline is still checked against the reference."""
    t_start = time.perf_counter()
    b = cfg.bench
    units, baseline, gated = _sides(cfg, lm, gate, prompts)
    key = ReferenceKey.of(lm, prompts, gen_tokens=b.gen_tokens, seed=cfg.seed, batch_size=b.batch_size)
    _warm_up(reuse if reuse is not None else ReuseCache(), key, [cfg], lm, [gate], units, baseline, [gated])
    costs = cost_model(lm, prompts[0].input_ids, gates=[gate], kv_policies=[b.kv_policy], **verify_positions([cfg]))
    if reuse is None:
        refs = _reference_runs(baseline, gated, units)
        reference_id, reused = new_reference_id(key), False
    else:
        refs, reference_id, reused = _reused_references(reuse, key, units, baseline)
    setup = time.perf_counter() - t_start
    timings, reproduced = _timed_rounds(baseline, gated, refs, b.repeats)
    if reuse is not None and not reproduced:
        reuse.drop(key)  # the worker no longer reproduces it: the next trial re-runs the self-check
    wall = time.perf_counter() - t_start
    return _row(cfg, lm, gate, costs, baseline, gated, refs, timings, reproduced, reference_id, reused, (wall, setup))


def _row(
    cfg: Config,
    lm: LoadedModel,
    gate: Gate,
    costs: CostModel,
    baseline: _Side,
    gated: _Side,
    refs: _References,
    timings: Timings,
    reproduced: bool,
    reference_id: str,
    reused: bool,
    seconds: tuple[float, float],
    share: int = 1,
) -> dict[str, Any]:
    """A measured trial's row; ``seconds``: its (bench, setup) seconds, a shared group's already
    apportioned (``run_shared_trials``), ``share`` the settings that shared the baseline."""
    b = cfg.bench
    runs = refs.prompt_runs(baseline, gated)
    steps = DecodeSteps.of_batches(refs.gated) if gated.batched else None
    row = metrics(runs, timings, costs, gate, b.kv_policy, lm.num_layers, steps)
    speculative = b.mode == "self_speculative"
    row.update(speculation(runs, costs, gate) if speculative else dict.fromkeys(SPECULATION_COLUMNS))
    deterministic = refs.deterministic and reproduced
    status, error = ("ok", None) if deterministic else ("nondeterministic", NOT_REPRODUCED)
    if speculative and deterministic and row["agreement"] != 1.0:  # lossless by construction: a bug if not
        status, error = "failed", f"self-speculation's output differs from full depth (agreement {row['agreement']})"
    row.update(
        status=status,
        error=error,
        deterministic=deterministic,
        determinism_max_logit_diff=refs.max_logit_diff,
        reference_id=reference_id,
        reference_reused=reused,
        baseline_shared=share,
        bench_seconds=seconds[0],
        setup_seconds=seconds[1],
    )
    return {**trial_fields(cfg, len(runs), gate), **row}


def verify_positions(cfgs: list[Config]) -> dict[str, int]:
    """The cost model's verification passes self-speculative settings need: up to draft_len + 1 positions."""
    spec = [c.bench.draft_len + 1 for c in cfgs if c.bench.mode == "self_speculative"]
    return {"verify_positions": max(spec)} if spec else {}


NOT_REPRODUCED = "full-depth baselines or timed repeats did not reproduce their tokens"
SPECULATION_COLUMNS = (
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_length",
    "tokens_per_verification",
    "draft_ms_per_token",
    "verify_ms_per_token",
)


def run_shared_trials(
    cfgs: list[Config], lm: LoadedModel, gates: list[Gate], prompts: list[Prompt], reuse: ReuseCache | None = None
) -> list[dict[str, Any]]:
    """Several gated settings of one model measured against one full-depth baseline per round:
    per round and unit the baseline and every setting's gated run, in an order that alternates
    (baseline, A, B, ... then ..., B, A, baseline); each setting its own row, its speedup against
    the baseline timed in the same rounds. The settings must share what the reference depends on
    (``ReferenceKey``: model, prompts, gen_tokens, seed, batch_size) and bench.repeats; gate,
    kv_policy and mode may differ. One self-check for the group (or none, reused from ``reuse``);
    the group's wall time (and its setup, the untimed work before the timed rounds) is apportioned to
    the rows by the seconds each setting's timed rounds took (``timed_shares``), so every row of a group
    reads the same bench_seconds / timed-rounds ratio."""
    t_start = time.perf_counter()
    keys = {
        ReferenceKey.of(lm, prompts, gen_tokens=c.bench.gen_tokens, seed=c.seed, batch_size=c.bench.batch_size)
        for c in cfgs
    }
    if not cfgs or len(keys) != 1 or len({c.bench.repeats for c in cfgs}) != 1 or len(gates) != len(cfgs):
        raise ValueError("shared-baseline settings must share model, prompts, gen_tokens, seed, batch_size, repeats")
    key = keys.pop()
    sides = [_sides(c, lm, g, prompts) for c, g in zip(cfgs, gates)]
    units, baseline = sides[0][0], sides[0][1]
    gated = [side[2] for side in sides]
    cache = reuse if reuse is not None else ReuseCache()  # without one: a private cache, one self-check
    _warm_up(cache, key, cfgs, lm, gates, units, baseline, gated)
    # every setting's probe in the same rounds
    costs = cost_model(
        lm, prompts[0].input_ids, gates=gates, kv_policies=[c.bench.kv_policy for c in cfgs], **verify_positions(cfgs)
    )
    shared, reference_id, reused = _reused_references(cache, key, units, baseline)
    refs = [_References(units, list(shared.baseline), [], shared.deterministic, shared.max_logit_diff) for _ in cfgs]
    setup = time.perf_counter() - t_start
    timings, reproduced = _timed_rounds_shared(baseline, gated, refs, cfgs[0].bench.repeats)
    if reuse is not None and not all(reproduced):
        reuse.drop(key)
    wall, n = time.perf_counter() - t_start, len(cfgs)
    return [
        _row(cfg, lm, gate, costs, baseline, side, ref, t, ok, reference_id, reused, (wall * w, setup * w), share=n)
        for cfg, gate, side, ref, t, ok, w in zip(cfgs, gates, gated, refs, timings, reproduced, timed_shares(timings))
    ]


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


def _warm_gated(
    reuse: ReuseCache, key: ReferenceKey, cfg: Config, lm: LoadedModel, gate: Gate, units: list, gated: _Side
) -> None:
    """Warm-up of a gated side, once per reference key and gate kind (probe, mode, kv_policy)."""
    b = cfg.bench
    gate_kind = (gate.probe_key, b.mode, b.kv_policy, b.draft_len if b.mode == "self_speculative" else None)
    if reuse.needs_warmup((key, id(lm.adapter), "gated", *gate_kind)):
        for _ in range(b.warmup):
            gated.run(units[0])
            progress.step()


SELF_CHECK_RUNS = 2  # untimed full-depth runs of each unit the determinism self-check makes
WARM_UP_AND_SELF_CHECK = "warm-up and self-check"  # a part of the time breakdown (``sweep.progress``)


def _warm_baseline(baseline: _Side, units: list[list[Prompt]], warmup: int, *, self_check: bool) -> None:
    """``warmup`` untimed runs of the baseline on the first unit before its timed rounds; a self-check
    that follows makes ``SELF_CHECK_RUNS`` of them itself, so only the rest run here."""
    for _ in range(max(warmup - SELF_CHECK_RUNS, 0) if self_check else warmup):
        baseline.run(units[0])
        progress.step()


def _warm_up(
    reuse: ReuseCache,
    key: ReferenceKey,
    cfgs: list[Config],
    lm: LoadedModel,
    gates: list[Gate],
    units: list[list[Prompt]],
    baseline: _Side,
    gated: list[_Side],
) -> None:
    """Warm-up before the cost model and the self-check: the baseline once per key (what a self-check
    still to come leaves of bench.warmup), each gated side once per key and gate kind."""
    with progress.phase("warm-up", part=WARM_UP_AND_SELF_CHECK):  # one step per run
        if reuse.needs_warmup((key, id(lm.adapter), "baseline")):
            _warm_baseline(baseline, units, cfgs[0].bench.warmup, self_check=reuse.get(key) is None)
        for cfg, gate, side in zip(cfgs, gates, gated):
            _warm_gated(reuse, key, cfg, lm, gate, units, side)


def _reused_references(
    reuse: ReuseCache, key: ReferenceKey, units: list[list[Prompt]], baseline: _Side
) -> tuple[_References, str, bool]:
    """The trial's references from ``reuse``, or taken (the self-check) and kept when the key is
    new and the self-check passes. Their gated list is left empty: the first timed round fills it."""
    ref = reuse.get(key)
    if ref is not None:
        refs = _References(units, baseline=list(ref.baseline), max_logit_diff=ref.max_logit_diff)
        return refs, ref.id, True
    reuse.counts["self_checks"] += 1
    refs = _reference_runs(baseline, None, units)
    reference_id = new_reference_id(key)
    if refs.deterministic:
        reuse.put(Reference(key, reference_id, list(refs.baseline), refs.max_logit_diff))
    return refs, reference_id, False


def _sides(cfg: Config, lm: LoadedModel, gate: Gate, prompts: list[Prompt]) -> tuple[list[list[Prompt]], _Side, _Side]:
    """The trial's units and its two sides: each prompt alone against ``gated_engine``, or
    (bench.batch_size > 1) whole batches of consecutive prompts under the batch engine."""
    b = cfg.bench
    if b.batch_size == 1:
        return [[p] for p in prompts], _Side(Engine(lm), b.gen_tokens), _Side(gated_engine(cfg, lm, gate), b.gen_tokens)
    from sweep.batching import BatchEngine, batches

    units = batches(prompts, b.batch_size)
    baseline, gated = BatchEngine(lm), BatchEngine(lm, gate, b.kv_policy)
    return units, _Side(baseline, b.gen_tokens, batched=True), _Side(gated, b.gen_tokens, batched=True)


def trial_fields(cfg: Config, n_prompts: int, gate: Gate | None = None) -> dict[str, Any]:
    """The columns that describe the trial itself (known before it runs); layer indices as
    the gate resolved them for the model when it is known."""
    g, b = cfg.gate, cfg.bench
    return {
        **trial_columns(cfg),  # trial_id and trial_key (sweep.identity)
        "source": "measured",
        "gate": g.name,
        "min_depth": g.min_depth,
        **setting_columns(g, gate.resolved if gate is not None else None),
        "kv_policy": b.kv_policy,
        "mode": b.mode,
        "batch_size": b.batch_size,
        "draft_len": b.draft_len if b.mode == "self_speculative" else None,
        "draft_stop": b.draft_stop if b.mode == "self_speculative" else None,
        "skip_ratio": _skip_ratio(g, gate),
        "prompt_set": cfg.prompts.name,
        "n_prompts": n_prompts,
        "gen_tokens": b.gen_tokens,
        "warmup": b.warmup,
        "repeats": b.repeats,
        **readout_columns(gate),
    }


def _skip_ratio(gate_cfg, gate: Gate | None) -> float | None:
    """|S| / 2L of a skip gate's set (null for other gates, and before the model's L is known)."""
    if gate_cfg.name != "skip" or gate is None:
        return None
    from sweep.skipset import SkipSet

    return SkipSet.parse(gate_cfg.skip).ratio(gate.num_layers)


def readout_columns(gate: Gate | None) -> dict[str, Any]:
    """Which fitted readouts a trial used (``sweep fit``): their content digest and fitting prompts."""
    readouts = getattr(gate, "readouts", None)
    if readouts is None:
        return {"readouts_id": None, "fit_prompts": None}
    ids = readouts.prompt_ids
    fitted = f"{readouts.prompt_set}: {ids[0]} .. {ids[-1]} ({len(ids)} prompts)" if ids else readouts.prompt_set
    return {"readouts_id": readouts.digest[:16], "fit_prompts": fitted}


def _reference_runs(baseline: _Side, gated: _Side | None, units: list[list[Prompt]]) -> _References:
    """Two full-depth baselines per unit (the self-check: the same tokens and, for single
    sequences, their max logit difference), then the gated run (none when ``gated`` is None:
    the first timed round gives it)."""
    refs = _References(units, max_logit_diff=None if baseline.batched else 0.0)
    shown = progress.start("self-check", len(units), part=WARM_UP_AND_SELF_CHECK)  # one step per unit
    for unit in units:
        first, second = baseline.run(unit, record=True), baseline.run(unit, record=True)
        if first.tokens != second.tokens:
            refs.deterministic = False
            ids = ", ".join(p.id for p in unit)
            log.warning("determinism self-check failed on %s: two full-depth baselines differ", ids)
        if refs.max_logit_diff is not None:
            refs.max_logit_diff = max(refs.max_logit_diff, float((first.logits - second.logits).abs().max()))
        _lighten(first)
        refs.baseline.append(first)
        if gated is not None:
            refs.gated.append(gated.run(unit))
        shown.advance()
    shown.close()
    return refs


def _lighten(record) -> None:
    """Drop what served the self-check (vocab-sized logits, hidden states, the KV cache): a
    trial, and a reused reference, keep tokens and exits."""
    if getattr(record, "logits", None) is not None:
        record.logits = None
    if getattr(record, "exit_hidden", None):
        record.exit_hidden = []
    if getattr(record, "cache", None) is not None:
        record.cache = None


def _timed_rounds(baseline: _Side, gated: _Side, refs: _References, repeats: int) -> tuple[Timings, bool]:
    """Decode and prefill seconds [round][unit] per side, interleaved, alternating which side
    goes first; whether every timed run reproduced its reference tokens (a unit without a gated
    reference takes its first timed gated run as one). The one timing loop of every trial: a
    unit is one prompt, or one batch."""
    timings, reproduced = _timed_rounds_shared(baseline, [gated], [refs], repeats)
    return timings[0], reproduced[0]


def _timed_rounds_shared(
    baseline: _Side, gated: list[_Side], refs: list[_References], repeats: int
) -> tuple[list[Timings], list[bool]]:
    """``_timed_rounds`` for one baseline and several gated sides: per round and unit the
    baseline, each gated side in turn and the A/A control (a second full-depth run), forward
    when round + unit is even, else reversed, so the baseline and the A/A swap ends; each side's
    Timings carry the baseline and the A/A timed in the same rounds."""
    units = refs[0].units
    timings = [Timings.empty(repeats, len(units)) for _ in gated]
    base_ok, gated_ok = True, [True] * len(gated)
    shown = progress.start("timed rounds", repeats * len(units), part="timed rounds")  # one step per round and unit
    for r in range(repeats):
        for i, unit in enumerate(units):
            order = ["baseline", *range(len(gated)), "aa"]
            for s in order if (r + i) % 2 == 0 else reversed(order):
                if s in ("baseline", "aa"):
                    gen = baseline.run(unit)
                    base_ok &= gen.tokens == refs[0].baseline[i].tokens
                    for t in timings:
                        decode, prefill = (
                            (t.base_decode, t.base_prefill) if s == "baseline" else (t.aa_decode, t.aa_prefill)
                        )
                        decode[r][i], prefill[r][i] = gen.decode_seconds, gen.prefill_seconds
                    continue
                gen, ref, t = gated[s].run(unit), refs[s], timings[s]
                if i >= len(ref.gated):  # no gated reference run: the first timed round's is the reference
                    ref.gated.append(gen)
                else:
                    gated_ok[s] &= gen.tokens == ref.gated[i].tokens
                t.gated_decode[r][i], t.gated_prefill[r][i] = gen.decode_seconds, gen.prefill_seconds
            shown.advance()
    shown.close()
    reproduced = [base_ok and ok for ok in gated_ok]
    if not all(reproduced):
        log.warning("a timed repeat did not reproduce its reference tokens")
    return timings, reproduced


def failed_row(cfg: Config, n_prompts: int, exc: BaseException, gate: Gate | None = None) -> dict[str, Any]:
    """A trial that raised: a row with its status and error, metrics null."""
    from sweep.store import PROVENANCE, TABLES

    # null metrics; provenance is the caller's (a job's submission_id, the model's revision)
    given = {c.name for c in PROVENANCE}
    row = {c.name: None for c in TABLES["trials"].columns if c.nullable and c.name not in given}
    row.update(trial_fields(cfg, n_prompts, gate))
    row.update(
        status="failed",
        error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500],
    )
    return row


def run_bench(cfg: Config) -> tuple[str, dict[str, Any], str]:
    """`sweep bench`: one trial, one Parquet row; returns (path, row, summary)."""
    from sweep.rows import format_row
    from sweep.run_info import new_run_id, provenance
    from sweep.store import write_table

    lm, gate, prompts = prepare(cfg)
    log.info("bench %s on %s: %d prompts x %d tokens", gate.describe(), lm.name, len(prompts), cfg.bench.gen_tokens)
    try:
        row = run_trial(cfg, lm, gate, prompts)
    except (RuntimeError, ValueError) as exc:  # CUDA out-of-memory is a RuntimeError
        log.error("trial failed: %s", exc)
        row = failed_row(cfg, len(prompts), exc, gate)
    run_id = cfg.run_id or new_run_id()
    prov = provenance(cfg, lm, run_id)
    row.update(sweep_name=None, worker_pid=None, worker_model_loads=None, trial_seconds=None)  # sweep-only columns
    with progress.timed("writing"):
        path = write_table(
            "trials", {k: [v] for k, v in row.items()}, root=cfg.results.root, provenance=prov, stem=row["trial_id"]
        )
    costs = (
        cost_model(lm, prompts[0].input_ids, gates=[gate], kv_policies=[cfg.bench.kv_policy], **verify_positions([cfg]))
        if cfg.bench.cost_model and row["status"] != "failed"
        else None
    )
    return str(path), {**prov, **row}, format_row({**prov, **row}, costs)
