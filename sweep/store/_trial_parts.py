"""The trials table's parts, each declaring its columns once, in the table's order (``TRIAL_PARTS`` in
``sweep.store._trials``): what a part says of a trial, column by column. Provenance, self-speculation and a
task's accuracy are declared with the other tables' building blocks (``_columns``, ``_task_columns``)."""

from __future__ import annotations

import polars as pl

from sweep.store._columns import GATE_FIELDS, Column, metric

STOPPED_AT = "a stopped setting's prompts when it stopped (search.rung_prompts, doubling); null otherwise"
STOP_RULE = (
    "a stopped setting's stopping rule: the sweep's search.{}; it counts as done only for a sweep under the same "
    "rule (another sweep measures it); null otherwise, and in stopped rows written before it was recorded"
)
STOP_HI = "a stopped setting's agreement_hi over those prompts, below search.min_agreement; null otherwise"

# which trial this is and how it ended
IDENTITY: tuple[Column, ...] = (
    Column(
        "trial_id",
        pl.String(),
        "",
        "stable hash of the trial's config (model identity, gate, bench, prompts, device, dtype, seed)",
    ),
    Column(
        "trial_key",
        pl.String(),
        "JSON",
        "the trial's defining config as canonical JSON text (model, gate, bench without cost_model, prompts, "
        "device "
        "(cpu or cuda), dtype, seed); trial_id is the first 16 hex digits of its sha256 "
        "(sweep.config.identity.id_of_key); "
        "null in rows written under schema 2",
        nullable=True,
    ),
    Column(
        "source",
        pl.String(),
        "",
        "measured (a closed-loop bench trial; simulated settings are in the `simulated` table)",
        nullable=True,
    ),
    Column("status", pl.String(), "", "ok | nondeterministic | failed | stopped"),
    Column("error", pl.String(), "", "why a trial failed (one line); null otherwise", nullable=True),
)

# the setting measured: the gate as resolved for the model, the bench's settings, the prompts
SETTING: tuple[Column, ...] = GATE_FIELDS + (
    Column("kv_policy", pl.String(), "", "propagate | full: K/V of skipped layers"),
    Column(
        "mode",
        pl.String(),
        "",
        "early_exit | self_speculative (draft with layers 1..exit_layer under gate=fixed, or with the full "
        "model minus the sublayers of gate.skip under gate=skip; verify with the full model)",
        nullable=True,
    ),
    Column(
        "draft_len",
        pl.Int32(),
        "tokens",
        "self_speculative: tokens drafted per verification at most; null otherwise",
        nullable=True,
    ),
    Column(
        "draft_stop",
        pl.Float64(),
        "probability",
        "self_speculative: drafting stops at a draft whose top-1 probability is below this (that draft is not "
        "verified); null: drafts run to draft_len",
        nullable=True,
    ),
    Column(
        "skip_ratio",
        pl.Float64(),
        "fraction",
        "gate=skip: |skip| / the model's skippable sublayers (2L where each layer has an attention and an MLP; a "
        "hybrid's mixers beside attention are not skippable), the fraction the draft bypasses; null otherwise",
        nullable=True,
    ),
    Column(
        "batch_size",
        pl.Int32(),
        "sequences",
        "sequences decoded together (whole prompts, left-padded to the batch's longest; a batch saves compute "
        "only once all its sequences exit)",
        nullable=True,
    ),
    Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
    Column("n_prompts", pl.Int32(), "prompts", "prompts in the trial"),
    Column("gen_tokens", pl.Int32(), "tokens", "greedy tokens generated per prompt"),
    Column(
        "warmup",
        pl.Int32(),
        "generations",
        "untimed warm-up generations per side (the baseline's include the self-check's two)",
    ),
    Column("repeats", pl.Int32(), "rounds", "timed rounds (each: every prompt, both sides, interleaved)"),
)

# how the gated tokens compare with full depth's, and the exits
AGREEMENT: tuple[Column, ...] = (
    metric("agreement", "fraction", "generated positions whose token equals the baseline's"),
    metric("prefix_agreement", "fraction", "mean over prompts of (positions before the first divergence) / gen_tokens"),
    metric("exact_match", "fraction", "prompts whose whole generation equals the baseline's"),
    metric(
        "exit_rate",
        "fraction",
        "generated tokens that exited before layer L (all gen_tokens; the first token's exit is decided at the "
        "prefill's last position and saves no compute)",
    ),
    metric("mean_exit_layer", "layers", "mean exit layer over all generated tokens (L when not exited)"),
    metric(
        "layers_saved",
        "fraction",
        "decoder-layer compute skipped on decode steps (tokens 2..n, per sequence): 1 - mean exit layer there / "
        "L, before probe and K/V costs (the first token is decided after a full-depth prefill and saves nothing)",
    ),
    metric(
        "step_layers_saved",
        "fraction",
        "decoder-layer work the exits skip on decode steps: 1 - mean layers run per step / L (a batch runs to its "
        "deepest sequence); under kv_policy=full the exited layers still run, for their K/V, so none is saved "
        "(skipped_compute false)",
    ),
)

# timing and noise: the measured and modelled speedups, the A/A floor, the cost model's prices
TIMING: tuple[Column, ...] = (
    metric(
        "speedup_wall",
        "ratio",
        "decode only: median over rounds of (baseline decode time summed over units / gated decode time summed "
        "over units), from round_baseline_ms and round_ms (same prompts, interleaved)",
    ),
    metric(
        "speedup_e2e_wall",
        "ratio",
        "whole requests: as speedup_wall over prefill (with the gate's calibration and first decision) + decode "
        "time, from the round_* columns",
    ),
    metric(
        "speedup_aa",
        "ratio",
        "the A/A control: speedup_wall's estimator on full depth against full depth, the second full-depth run "
        "of every unit timed in the same rounds as the trial (round_baseline_ms / round_aa_ms); noise around 1; "
        "null in rows written before schema 7",
    ),
    metric("speedup_e2e_aa", "ratio", "the A/A control on whole requests (speedup_e2e_wall's estimator)"),
    metric(
        "noise_floor",
        "fraction",
        "the trial's A/A noise floor f for speedup_wall: a speedup within [1/(1+f), 1+f] cannot be told from 1.0. "
        "The smallest f such that speedup_aa's estimator on its timed rounds drawn with replacement lies within "
        "that band with probability >= 0.95, computed exactly (sweep.bench.noise.noise_floor: covers the A/A's "
        "offset "
        "from 1 and its spread); null without an A/A",
    ),
    metric("noise_floor_e2e", "fraction", "noise_floor for speedup_e2e_wall (whole requests)"),
    metric(
        "speedup_model",
        "ratio",
        "speedup the measured cost model predicts from the gated run's exits and probes on decode steps (tokens "
        "2..n, as timed); batches: from the layers each step ran, plus the second head and K/V overwrites of "
        "partly exited steps, priced at one sequence's costs (the cost model is measured at batch size 1: a batch "
        "whose layers cost relatively more than one sequence's is predicted faster than it runs)",
    ),
    metric(
        "speedup_e2e_model",
        "ratio",
        "end-to-end speedup the cost model predicts: every prompt's prefill (linear in its length from the "
        "measured prompt) and the gate's calibration (cost_calibration_ms) plus the decode steps of "
        "speedup_model; null for self_speculative",
    ),
    metric("baseline_ms_per_token", "ms", "median over repeats of full-depth decode ms per token"),
    metric("ms_per_token", "ms", "median over repeats of gated decode ms per token"),
    metric("probe_cost_layers", "layers", "one probe of this gate, in layer-equivalents (0 for full, fixed)"),
    metric(
        "kv_cost_layers", "layers", "filling one skipped layer's K/V, in layer-equivalents (1 under kv_policy=full)"
    ),
    metric("head_cost_layers", "layers", "final norm + lm_head on one position, in layer-equivalents"),
    metric("cost_layer_ms", "ms", "measured cost of one decoder layer in a decode step"),
    metric("cost_head_ms", "ms", "measured cost of final norm + lm_head on one position"),
    metric(
        "cost_probe_ms",
        "ms",
        "measured cost of one probe of this gate, in situ: full-depth decode steps taking its decision after "
        "every layer without exiting, against plain steps of the same rounds; never below its decision "
        "timed alone on one position",
    ),
    metric("cost_kv_ms", "ms", "measured cost of the K/V fill of one skipped layer (propagate)"),
    metric("cost_overhead_ms", "ms", "rest of a full-depth decode step (embedding, mask, RoPE, framework)"),
    metric("cost_prefill_ms", "ms", "cost model: full-depth prefill per prompt, mean over the trial's prompts"),
    metric(
        "cost_calibration_ms",
        "ms",
        "cost model: the gate's per-prompt calibration (conformal: a lens over every prompt position per probed "
        "layer and layer L), mean over prompts; 0 for gates without one",
    ),
    metric(
        "cost_model_source",
        "",
        "fresh (measured in this process), cached (docs/bench.md), or unsteady (measured twice here, and neither "
        "time did its parts fit its step, as on a machine busy with other work: its cost figures and the _model "
        "speedups are not to be trusted)",
        pl.String(),
    ),
)

# what the figures rest on: determinism, the full-depth references, fitted readouts, a shared baseline, the
# bench's seconds
REFERENCE: tuple[Column, ...] = (
    Column(
        "deterministic",
        pl.Boolean(),
        "",
        "two full-depth baselines and every timed repeat reproduced their tokens",
        nullable=True,
    ),
    metric("determinism_max_logit_diff", "logits", "max |logit difference| between the two full-depth baselines"),
    Column(
        "reference_id",
        pl.String(),
        "",
        "the full-depth reference (and self-check) the trial's tokens were checked against: key digest, "
        "worker pid and time taken; shared by the trials of one sweep worker that reused it",
        nullable=True,
    ),
    Column(
        "reference_reused",
        pl.Boolean(),
        "",
        "true: the reference and its self-check were taken by an earlier trial in the same worker "
        "(same model, dtype, device, prompts, gen_tokens, seed, batch_size); false: this trial took them",
        nullable=True,
    ),
    Column(
        "reference_source",
        pl.String(),
        "",
        "where the trial's full-depth reference came from: fresh (taken for this trial or its group of settings: "
        "`sweep bench`, sweep.reuse=false) or cached (a sweep worker's, sweep.reuse=true; reference_reused "
        "says whether this trial took it)",
        nullable=True,
    ),
    Column(
        "readouts_id",
        pl.String(),
        "",
        "the fitted readouts (tuned-lens translators, exit classifiers; `sweep fit`) the gate read: the first 16 "
        "hex digits of their content digest, the name of their file; null for gates that read none",
        nullable=True,
    ),
    Column(
        "fit_prompts",
        pl.String(),
        "",
        "the prompts those readouts were fitted on (set, first and last id, count): disjoint from this trial's "
        "prompts by check; null without readouts",
        nullable=True,
    ),
    Column(
        "baseline_shared",
        pl.Int64(),
        "settings",
        "settings timed against this row's full-depth baseline in the same rounds (sweep.shared_baseline): "
        "1 = a baseline of its own; more = one baseline run per round and unit, interleaved with every "
        "setting's gated run; the group's wall time is then apportioned to its rows by the seconds each "
        "setting's timed rounds took (bench_seconds, setup_seconds)",
        nullable=True,
    ),
    metric(
        "calibration_ms",
        "ms",
        "mean per-prompt gate calibration time (conformal's tau), measured; outside decode timing, inside the "
        "prefill timing",
    ),
    metric(
        "bench_seconds",
        "s",
        "wall time of the whole trial (a shared baseline's group: this setting's share, by its timed rounds' "
        "seconds), setup_seconds included",
    ),
    metric(
        "setup_seconds",
        "s",
        "of bench_seconds, the untimed work before the timed rounds: cost model measurements, warm-up, the "
        "reference runs and determinism self-check; near 0 where a sweep worker reused them (reference_reused)",
    ),
)

# where a sweep computed it (its sweep, worker process and time)
WORKER: tuple[Column, ...] = (
    Column(
        "sweep_name", pl.String(), "", "the `sweep run` the trial belongs to; null for `sweep bench`", nullable=True
    ),
    Column("worker_pid", pl.Int64(), "", "pid of the Ray worker that ran it; null for `sweep bench`", nullable=True),
    Column(
        "worker_model_loads",
        pl.Int32(),
        "loads",
        "models that worker process had loaded when the trial ended (1 = loaded once, reused)",
        nullable=True,
    ),
    metric("trial_seconds", "s", "worker-side wall time of the whole trial (compose, model from cache or load, bench)"),
)

# the prompts, one entry per prompt
PROMPTS: tuple[Column, ...] = (
    Column(
        "prompt_ids",
        pl.List(pl.String()),
        "",
        "prompt ids, in order (the per-prompt lists below follow it)",
        nullable=True,
    ),
    Column(
        "prompt_categories",
        pl.List(pl.String()),
        "",
        'per prompt: its category (chat: the built-in set; code: HumanEval; a JSONL line\'s "category", default '
        "jsonl): the report's speedup and acceptance per category",
        nullable=True,
    ),
    Column(
        "prompt_input_tokens",
        pl.List(pl.Int32()),
        "tokens",
        "per prompt: its input length as decoded (the same at every batch size)",
        nullable=True,
    ),
    Column("prompt_agreement", pl.List(pl.Float64()), "fraction", "agreement per prompt", nullable=True),
)


def per_round(name: str, meaning: str) -> Column:
    """A per-round, per-unit timing column: ms of each timed round's units ([round][unit])."""
    return Column(name, pl.List(pl.List(pl.Float64())), "ms", meaning, nullable=True)


# a setting stopped early (search.min_agreement)
STOPPING: tuple[Column, ...] = (
    Column("stopped_at_prompts", pl.Int32(), "prompts", STOPPED_AT, nullable=True),
    Column("stop_agreement_hi", pl.Float64(), "fraction", STOP_HI, nullable=True),
    Column("stop_min_agreement", pl.Float64(), "fraction", STOP_RULE.format("min_agreement"), nullable=True),
    Column("stop_rung_prompts", pl.Int32(), "prompts", STOP_RULE.format("rung_prompts"), nullable=True),
)

# per prompt and per timed round
ROUNDS: tuple[Column, ...] = (
    Column("prompt_prefix_agreement", pl.List(pl.Float64()), "fraction", "prefix agreement per prompt", nullable=True),
    Column(
        "prompt_speedup_wall",
        pl.List(pl.Float64()),
        "ratio",
        "per prompt: median over repeats of baseline / gated decode time",
        nullable=True,
    ),
    Column(
        "prompt_baseline_ms",
        pl.List(pl.Float64()),
        "ms",
        "per prompt: median over repeats of full-depth decode ms per token",
        nullable=True,
    ),
    Column(
        "prompt_ms",
        pl.List(pl.Float64()),
        "ms",
        "per prompt: median over repeats of gated decode ms per token",
        nullable=True,
    ),
    per_round(
        "round_baseline_ms",
        "[round][unit] full-depth decode ms (tokens 2..n); a unit is a prompt, or a batch of batch_size prompts "
        "in prompt_ids order",
    ),
    per_round("round_ms", "[round][unit] gated decode ms"),
    per_round(
        "round_baseline_prefill_ms",
        "[round][unit] full-depth prefill ms (to the first token)",
    ),
    per_round(
        "round_prefill_ms",
        "[round][unit] gated prefill ms (prefill, calibration, first decision)",
    ),
    per_round(
        "round_aa_ms",
        "[round][unit] the A/A control's decode ms: a second full-depth run of each unit in the same rounds "
        "(the baseline and it swap ends of each round's order)",
    ),
    per_round(
        "round_aa_prefill_ms",
        "[round][unit] the A/A control's prefill ms",
    ),
)
