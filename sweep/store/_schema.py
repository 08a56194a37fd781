"""The results contract, declared once: every table, column, type, unit and meaning.

docs/schema.md is generated from this module (``sweep schema``) and a test keeps the
two equal. Add columns freely; renaming a column or changing its meaning bumps
``SCHEMA_VERSION``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from sweep.gatespec import GATE_SPECS, PARAMS, ParamSpec

# 2: layers_saved counts decode steps only (the first token saves nothing)
# 3: trials carry trial_key, the JSON text that trial_id hashes
SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType
    unit: str
    meaning: str
    nullable: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    partition_by: tuple[str, ...]  # hive directories, in order: root/<table>/<col>=<value>/...
    unit_of_work: str  # what one file holds
    description: str
    columns: tuple[Column, ...]
    single_file: bool = False  # a derived table: one file <root>/<name>.parquet, replaced by each writer

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema({c.name: c.dtype for c in self.columns})


PROVENANCE: tuple[Column, ...] = (
    Column("schema_version", pl.Int32(), "", "version of this schema the row was written under"),
    Column("run_id", pl.String(), "", "id of the command run that wrote the row"),
    Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the row's file was written"),
    Column("model", pl.String(), "", "model label (conf/model name or derived from model.path)"),
    Column("model_source", pl.String(), "", "packaged | gguf | hf | tiny"),
    Column("model_hash", pl.String(), "", "content hash of the weights (sha256 of the file, sampled above 256 MiB; hub:ID@commit for hub models)"),
    Column("model_revision", pl.String(), "", "hub commit or revision, null when not from a hub", nullable=True),
    Column("family", pl.String(), "", "model family (llama, mistral, qwen2, qwen3, gemma3)"),
    Column("num_layers", pl.Int32(), "layers", "L, the number of decoder layers"),
    Column("device", pl.String(), "", "cpu or cuda:N (GPU name)"),
    Column("dtype", pl.String(), "", "weights and activations dtype"),
    Column("seed", pl.Int64(), "", "config seed"),
    Column("git_sha", pl.String(), "", "project commit, '-dirty' when the checkout had changes"),
    Column("sweep_version", pl.String(), "", "version of this package"),
    Column("torch_version", pl.String(), "", "torch version"),
    Column("transformers_version", pl.String(), "", "transformers version"),
    Column("python_version", pl.String(), "", "Python version"),
)

PROFILE = Table(
    name="profile",
    partition_by=("model",),
    unit_of_work="one `sweep profile` run (all its prompts)",
    description=(
        "Per-layer trace of greedy full-depth decoding: one row per (prompt, position, layer). "
        "Position p's hidden states predict the token at p+1; `phase` says whether p was part of the "
        "prompt (prefill) or a generated token fed back (decode). Layers are 1-indexed; layer L is full depth. "
        "All positions of a prompt are captured while decoding, by the forwards the engine runs: a prefill of the prompt, "
        "then one KV-cached step per generated token (the gates' signals are the ones the engine computes, in any dtype)."
    ),
    columns=PROVENANCE
    + (
        Column("prompt_id", pl.String(), "", "prompt id within its set (chat/3, HumanEval/0, a JSONL id)"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("position", pl.Int32(), "tokens", "0-based position in prompt + generation"),
        Column("phase", pl.String(), "", "prefill | decode"),
        Column("layer", pl.Int32(), "", "exit layer l in 1..L (layers 1..l ran)"),
        Column("token_id", pl.Int64(), "", "input token at this position (rebuilds the sequence)"),
        Column("delta", pl.Float64(), "ratio", "saturation delta ||h_l - h_{l-1}||_2 / ||h_l||_2 (h_0 = embedding output)"),
        Column("margin", pl.Float64(), "logits", "gamma_l: top1 - top2 of z_l = lm_head(final_norm(h_l))"),
        Column("top1", pl.Int64(), "", "argmax of z_l"),
        Column("top1_final", pl.Int64(), "", "argmax of z_L (the model's greedy token)"),
        Column("top1_match", pl.Boolean(), "", "top1 == top1_final"),
        Column("residual_inf", pl.Float64(), "logits", "tau_l: ||z_l - z_L||_inf"),
        Column("cos_hidden", pl.Float64(), "", "cosine of final_norm(h_l) and final_norm(h_L)"),
        Column("cos_logits", pl.Float64(), "", "cosine of the mean-centred logits z_l and z_L (softmax ignores a constant shift; raw logit cosines are dominated by it)"),
        Column("topk_overlap", pl.Float64(), "fraction", "|topK(z_l) & topK(z_L)| / K"),
        Column("topk", pl.Int32(), "tokens", "K of topk_overlap"),
        Column("prob_margin", pl.Float64(), "probability", "top-1 minus top-2 probability of softmax(z_l) (CALM's softmax response)", nullable=True),
        Column("entropy", pl.Float64(), "nats", "entropy of softmax(z_l)", nullable=True),
        Column("cos_prev", pl.Float64(), "", "cosine of h_l and h_{l-1} (CALM's hidden-state saturation; h_0 = embedding output)", nullable=True),
        Column("pca_delta", pl.Float64(), "ratio", "||P n_l - P n_{l-1}|| / ||P n_l||, n = final_norm(h), P = the lm_head's top pca_k principal directions", nullable=True),
        Column("pca_k", pl.Int32(), "directions", "k of pca_delta", nullable=True),
    ),
)

# a gate setting, as trials and simulated rows carry it: the parameter columns come from the
# gate-spec table (sweep.gatespec), so a new gate parameter is a new column of every table here
def _gate_column(param: ParamSpec) -> Column:
    takers = [g.name for g in GATE_SPECS if param.name in g.accepts]
    unset = "gates that do not take it" if len(takers) > 2 else "gates other than " + " and ".join(takers)
    meaning = param.meaning if "null" in param.meaning else f"{param.meaning}; null for {unset}"
    return Column(param.name, {int: pl.Int32(), float: pl.Float64()}[param.type], param.unit, meaning, nullable=True)


GATE_FIELDS: tuple[Column, ...] = (
    Column("gate", pl.String(), "", f"gate name ({', '.join(GATE_SPECS.names())})"),
    Column("min_layer", pl.Int32(), "", "first layer after which the gate may exit (resolved from min_depth when set)"),
    Column("min_depth", pl.Float64(), "fraction", "min_layer as a fraction of depth, when the setting gave it that way", nullable=True),
) + tuple(_gate_column(p) for p in PARAMS.values())


def _metric(name: str, unit: str, meaning: str, dtype: pl.DataType | None = None) -> Column:
    return Column(name, dtype if dtype is not None else pl.Float64(), unit, meaning, nullable=True)


TRIALS = Table(
    name="trials",
    partition_by=("model", "gate"),
    unit_of_work="trial: one (model, gate, thresholds, bench settings) measured by the bench",
    description=(
        "One row per bench trial. Metrics compare the gated generation with the full-depth greedy "
        "baseline on the same prompts, token by token, and time both interleaved in one process. "
        "Decode timings cover tokens 2..n; prefill (full depth on both sides) is timed apart, with the gate's "
        "calibration and the first token's decision, and enters the end-to-end figures (`speedup_e2e_*`). "
        "Failed trials are rows too (status `failed`, metrics null, `error` set); a trial whose two "
        "full-depth baselines (or any timed repeat) disagree is `nondeterministic`, never `ok`."
    ),
    columns=PROVENANCE
    + (
        Column("trial_id", pl.String(), "", "stable hash of the trial's config (model identity, gate, bench, prompts, device, dtype, seed)"),
        Column(
            "trial_key", pl.String(), "JSON",
            "the trial's defining config as canonical JSON text (model, gate, bench without cost_model, prompts, device "
            "(cpu or cuda), dtype, seed); trial_id is the first 16 hex digits of its sha256 (sweep.identity.id_of_key); "
            "null in rows written under schema 2",
            nullable=True,
        ),
        Column("source", pl.String(), "", "measured (a closed-loop bench trial; simulated settings are in the `simulated` table)", nullable=True),
        Column("status", pl.String(), "", "ok | nondeterministic | failed"),
        Column("error", pl.String(), "", "why a trial failed (one line); null otherwise", nullable=True),
    )
    + GATE_FIELDS
    + (
        Column("kv_policy", pl.String(), "", "propagate | full: K/V of skipped layers"),
        Column("mode", pl.String(), "", "early_exit | self_speculative (draft with layers 1..exit_layer, verify with the full model)", nullable=True),
        Column("draft_len", pl.Int32(), "tokens", "self_speculative: tokens drafted per verification; null otherwise", nullable=True),
        Column("batch_size", pl.Int32(), "sequences", "sequences decoded together (whole prompts, left-padded to the batch's longest; a batch saves compute only once all its sequences exit)", nullable=True),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("n_prompts", pl.Int32(), "prompts", "prompts in the trial"),
        Column("gen_tokens", pl.Int32(), "tokens", "greedy tokens generated per prompt"),
        Column("warmup", pl.Int32(), "generations", "untimed warm-up generations per side"),
        Column("repeats", pl.Int32(), "rounds", "timed rounds (each: every prompt, both sides, interleaved)"),
        _metric("agreement", "fraction", "generated positions whose token equals the baseline's"),
        _metric("prefix_agreement", "fraction", "mean over prompts of (positions before the first divergence) / gen_tokens"),
        _metric("exact_match", "fraction", "prompts whose whole generation equals the baseline's"),
        _metric("exit_rate", "fraction", "generated tokens that exited before layer L (all gen_tokens; the first token's exit is decided at the prefill's last position and saves no compute)"),
        _metric("mean_exit_layer", "layers", "mean exit layer over all generated tokens (L when not exited)"),
        _metric("layers_saved", "fraction", "decoder-layer compute skipped on decode steps (tokens 2..n, per sequence): 1 - mean exit layer there / L, before probe and K/V costs (the first token is decided after a full-depth prefill and saves nothing)"),
        _metric("step_layers_saved", "fraction", "decoder-layer work skipped on decode steps: 1 - mean layers run per step / L (a batch runs to its deepest sequence)"),
        _metric("speedup_wall", "ratio", "decode only: median over rounds of (baseline decode time summed over units / gated decode time summed over units), from round_baseline_ms and round_ms (same prompts, interleaved)"),
        _metric("speedup_e2e_wall", "ratio", "whole requests: as speedup_wall over prefill (with the gate's calibration and first decision) + decode time, from the round_* columns"),
        _metric("speedup_model", "ratio", "speedup the measured cost model predicts from the gated run's exits and probes on decode steps (tokens 2..n, as timed); batches: from the layers each step ran, plus the second head and K/V overwrites of partly exited steps"),
        _metric("speedup_e2e_model", "ratio", "end-to-end speedup the cost model predicts: every prompt's prefill (linear in its length from the measured prompt) and the gate's calibration (cost_calibration_ms) plus the decode steps of speedup_model; null for self_speculative"),
        _metric("baseline_ms_per_token", "ms", "median over repeats of full-depth decode ms per token"),
        _metric("ms_per_token", "ms", "median over repeats of gated decode ms per token"),
        _metric("probe_cost_layers", "layers", "one probe of this gate, in layer-equivalents (0 for full, fixed)"),
        _metric("kv_cost_layers", "layers", "filling one skipped layer's K/V, in layer-equivalents (1 under kv_policy=full)"),
        _metric("head_cost_layers", "layers", "final norm + lm_head on one position, in layer-equivalents"),
        _metric("cost_layer_ms", "ms", "measured cost of one decoder layer in a decode step"),
        _metric("cost_head_ms", "ms", "measured cost of final norm + lm_head on one position"),
        _metric("cost_probe_ms", "ms", "measured cost of one probe of this gate"),
        _metric("cost_kv_ms", "ms", "measured cost of the K/V fill of one skipped layer (propagate)"),
        _metric("cost_overhead_ms", "ms", "rest of a full-depth decode step (embedding, mask, RoPE, framework)"),
        _metric("cost_prefill_ms", "ms", "cost model: full-depth prefill per prompt, mean over the trial's prompts"),
        _metric("cost_calibration_ms", "ms", "cost model: the gate's per-prompt calibration (conformal: a lens over every prompt position per probed layer and layer L), mean over prompts; 0 for gates without one"),
        Column("deterministic", pl.Boolean(), "", "two full-depth baselines and every timed repeat reproduced their tokens", nullable=True),
        _metric("determinism_max_logit_diff", "logits", "max |logit difference| between the two full-depth baselines"),
        _metric("calibration_ms", "ms", "mean per-prompt gate calibration time (conformal's tau), measured; outside decode timing, inside the prefill timing"),
        _metric("bench_seconds", "s", "wall time of the whole trial"),
        _metric("acceptance_rate", "fraction", "self_speculative: drafted tokens the full model accepted"),
        _metric("mean_accepted_length", "tokens", "self_speculative: mean accepted drafts per verification"),
        _metric("tokens_per_verification", "tokens", "self_speculative: tokens committed per full-model pass (accepted drafts + 1)"),
        Column("sweep_name", pl.String(), "", "the `sweep run` experiment the trial belongs to; null for `sweep bench`", nullable=True),
        Column("worker_pid", pl.Int64(), "", "process id of the Ray worker that ran the trial; null for `sweep bench`", nullable=True),
        Column("worker_model_loads", pl.Int32(), "loads", "models that worker process had loaded when the trial ended (1 = loaded once, reused)", nullable=True),
        _metric("trial_seconds", "s", "worker-side wall time of the whole trial (compose, model from cache or load, bench)"),
        Column("prompt_ids", pl.List(pl.String()), "", "prompt ids, in order (the per-prompt lists below follow it)", nullable=True),
        Column("prompt_input_tokens", pl.List(pl.Int32()), "tokens", "per prompt: its input length as decoded (the same at every batch size)", nullable=True),
        Column("prompt_agreement", pl.List(pl.Float64()), "fraction", "agreement per prompt", nullable=True),
        Column("prompt_prefix_agreement", pl.List(pl.Float64()), "fraction", "prefix agreement per prompt", nullable=True),
        Column("prompt_speedup_wall", pl.List(pl.Float64()), "ratio", "per prompt: median over repeats of baseline / gated decode time", nullable=True),
        Column("prompt_baseline_ms", pl.List(pl.Float64()), "ms", "per prompt: median over repeats of full-depth decode ms per token", nullable=True),
        Column("prompt_ms", pl.List(pl.Float64()), "ms", "per prompt: median over repeats of gated decode ms per token", nullable=True),
        Column("round_baseline_ms", pl.List(pl.List(pl.Float64())), "ms", "[round][unit] full-depth decode ms (tokens 2..n); a unit is a prompt, or a batch of batch_size prompts in prompt_ids order", nullable=True),
        Column("round_ms", pl.List(pl.List(pl.Float64())), "ms", "[round][unit] gated decode ms", nullable=True),
        Column("round_baseline_prefill_ms", pl.List(pl.List(pl.Float64())), "ms", "[round][unit] full-depth prefill ms (to the first token)", nullable=True),
        Column("round_prefill_ms", pl.List(pl.List(pl.Float64())), "ms", "[round][unit] gated prefill ms (prefill, calibration, first decision)", nullable=True),
    ),
)

SIMULATED = Table(
    name="simulated",
    partition_by=("model",),
    unit_of_work="`sweep run search=screen` (every setting of its dense grid)",
    description=(
        "Settings replayed on a profile trace instead of run: per decision position (each prompt's last prefill "
        "position and its decode positions) the layer where the gate would exit, as the closed-loop engine decides; "
        "agreement is teacher-forced (the trace's context is full depth, so errors that cascade through the cache in "
        "a closed loop are not seen: it is optimistic). `trial_id` is the id the closed-loop trial of the same setting "
        "has in `trials`, for joining simulated against measured."
    ),
    columns=PROVENANCE
    + (
        Column("trial_id", pl.String(), "", "the id of the closed-loop trial of this setting (join key with `trials`)"),
        Column("source", pl.String(), "", "simulated"),
        Column("sweep_name", pl.String(), "", "the screen sweep"),
        Column("trace_run_id", pl.String(), "", "run_id of the profile trace replayed (in the `profile` table)"),
    )
    + GATE_FIELDS
    + (
        Column("kv_policy", pl.String(), "", "the K/V policy the predicted speedup assumes"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("n_prompts", pl.Int32(), "prompts", "prompts in the trace"),
        Column("gen_tokens", pl.Int32(), "tokens", "generated tokens per prompt in the trace"),
        Column("positions", pl.Int32(), "tokens", "decision positions replayed"),
        Column("agreement_tf", pl.Float64(), "fraction", "teacher-forced agreement: exited top-1 equals the final top-1"),
        Column("exit_rate", pl.Float64(), "fraction", "decision positions that exit before layer L"),
        Column("mean_exit_layer", pl.Float64(), "layers", "mean exit layer (L when not exited)"),
        Column("speedup_model", pl.Float64(), "ratio", "speedup the measured cost model predicts on decode positions"),
        Column("on_front", pl.Boolean(), "", "on the simulated Pareto front (speedup_model against agreement_tf, per model)"),
        Column("selected", pl.Boolean(), "", "run closed-loop: on the front or next to its knee"),
    ),
)

RANKED: tuple[Column, ...] = (
    Column("speedup_metric", pl.String(), "", "what `speedup` ranks by (analysis.speedup): speedup_wall (decode) | speedup_e2e_wall (whole requests)"),
    Column("skipped_compute", pl.Boolean(), "", "the trial skipped decoder-layer work: self_speculative, or decode steps that exited (step_layers_saved > 0) under a kv_policy other than full"),
    Column("speedup", pl.Float64(), "ratio", "the ranked speedup: speedup_metric's value where skipped_compute, else 1.0 by construction (its measured ratio is timing noise)"),
    Column("speedup_noise", pl.Float64(), "ratio", "trials that skipped no compute: their measured speedup_metric (noise around 1); null otherwise", nullable=True),
)

CONFIDENCE: tuple[Column, ...] = (
    _metric("agreement_lo", "fraction", "lower end of the bootstrap interval of agreement: prompts resampled with replacement, the mean of per-prompt agreement on each resample (level in ci_level; generator seeded from analysis.seed and trial_id)"),
    _metric("agreement_hi", "fraction", "upper end of the bootstrap interval of agreement"),
    _metric("speedup_lo", "ratio", "lower end of the bootstrap interval of `speedup`: units (prompts, or batches) and timed rounds resampled with replacement from the round_* timings, and on each resample the bench's own estimator (median over rounds of summed baseline ms / summed gated ms; prefill added for speedup_e2e_wall); 1.0 where no compute was skipped"),
    _metric("speedup_hi", "ratio", "upper end of the bootstrap interval of `speedup`"),
    _metric("ci_level", "fraction", "confidence level of the intervals (0.95); null when the row has no per-prompt values"),
    Column("ci_prompts", pl.Int32(), "prompts", "prompts the intervals were resampled from", nullable=True),
    Column("ci_few_prompts", pl.Boolean(), "", "ci_prompts < analysis.ci_min_prompts (default 8): the interval is too coarse to trust", nullable=True),
)

PARETO = Table(
    name="pareto",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` beside the data as <results.root>/pareto.parquet: the trials on a Pareto front "
        "of `speedup` (max; speedup_metric where the trial skipped compute, else 1.0) against agreement (max), over "
        "`status == ok` rows. `scope` says which front: `model` (all gates of a model) or `model+gate`. Every column "
        "of `trials`, plus the ones below."
    ),
    columns=TRIALS.columns
    + (Column("scope", pl.String(), "", "model (front across gates) | model+gate (front of one gate)"),)
    + RANKED
    + CONFIDENCE,
    single_file=True,
)

KNEES = Table(
    name="knees",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/knees.parquet: one row per front (scope, model, gate) of at "
        "least 3 points (fewer have no bend). The knee by the chord method on (`speedup`, agreement): both axes "
        "min-max normalised over the front, the point farthest from the line joining the front's extremes (ties: "
        "higher agreement, then trial_id). With 12 or more front points, the Kneedle knee (the `kneed` package: "
        "concave, decreasing) as a cross-check."
    ),
    columns=(
        Column("schema_version", pl.Int32(), "", "version of this schema"),
        Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the file was written"),
        Column("scope", pl.String(), "", "model | model+gate"),
        Column("model", pl.String(), "", "model label"),
        Column("gate", pl.String(), "", "the gate, or `all` for a model's front across gates"),
        Column("front_points", pl.Int32(), "trials", "trials on the front"),
        Column("trial_id", pl.String(), "", "the knee trial (chord method)"),
        Column("speedup_metric", pl.String(), "", "what `speedup` ranks by: speedup_wall | speedup_e2e_wall"),
        Column("speedup", pl.Float64(), "ratio", "the knee's ranked speedup (see `pareto`)"),
        Column("speedup_wall", pl.Float64(), "ratio", "the knee's measured speedup_wall"),
        Column("agreement", pl.Float64(), "fraction", "the knee's agreement"),
        Column("knee_gate", pl.String(), "", "the knee trial's gate"),
        Column("knee_params", pl.String(), "", "the knee trial's gate parameters, as key=value text"),
        Column("kneedle_trial_id", pl.String(), "", "the Kneedle knee (12+ points and kneed found one); else null", nullable=True),
        Column("kneedle_speedup", pl.Float64(), "ratio", "the Kneedle knee's ranked speedup", nullable=True),
        Column("kneedle_agreement", pl.Float64(), "fraction", "the Kneedle knee's agreement", nullable=True),
    ),
    single_file=True,
)

TARGETS = Table(
    name="targets",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/targets.parquet: per model and agreement target, the `ok` trial "
        "with the highest ranked `speedup` among those with agreement >= target (ties: higher agreement, then "
        "trial_id); trial columns null when no trial reaches the target."
    ),
    columns=(
        Column("schema_version", pl.Int32(), "", "version of this schema"),
        Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the file was written"),
        Column("model", pl.String(), "", "model label"),
        Column("target", pl.Float64(), "fraction", "the agreement target"),
        Column("trial_id", pl.String(), "", "the best trial, null when none reaches the target", nullable=True),
        Column("gate", pl.String(), "", "its gate", nullable=True),
        Column("params", pl.String(), "", "its gate parameters (and bench mode, draft_len, batch_size when not the default), as key=value text", nullable=True),
        Column("mode", pl.String(), "", "its bench mode: early_exit | self_speculative", nullable=True),
        Column("speedup_wall", pl.Float64(), "ratio", "its measured speedup_wall", nullable=True),
        Column("speedup_e2e_wall", pl.Float64(), "ratio", "its measured speedup_e2e_wall", nullable=True),
        Column("agreement", pl.Float64(), "fraction", "its agreement", nullable=True),
        Column("exit_rate", pl.Float64(), "fraction", "fraction of its generated tokens that exited before layer L (self_speculative: 0, its tokens are all the full model's)", nullable=True),
        Column("acceptance_rate", pl.Float64(), "fraction", "self_speculative: drafted tokens the full model accepted; null otherwise", nullable=True),
    )
    + tuple(dataclasses.replace(c, nullable=True) for c in RANKED)
    + CONFIDENCE,
    single_file=True,
)

TABLES: dict[str, Table] = {t.name: t for t in (PROFILE, TRIALS, SIMULATED, PARETO, KNEES, TARGETS)}


def markdown() -> str:
    """docs/schema.md: the contract as a document."""
    lines = [
        "# Results schema",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Generated from `sweep/store/_schema.py` by `sweep schema`; "
        "a test keeps this file and the code equal.",
        "",
        "Every table lives under `results.root`, one directory per table, hive-partitioned "
        "(`<root>/<table>/<column>=<value>/<file>.parquet`); the partition columns are also stored in the "
        "files. Each file is written to a hidden temporary name and renamed into place, so a reader never "
        "sees a half-written file; files whose names start with `.` are never results. Every file carries "
        "key-value metadata `sweep.schema_version` and `sweep.table`.",
        "",
        "Compatibility: columns are only ever added under one version. Renaming a column or changing its "
        "meaning or unit bumps the version. Read with the schema of the newest version and "
        "`missing_columns=\"insert\"` so older files load with nulls in newer columns (`sweep.store.scan` does).",
        "",
    ]
    for table in TABLES.values():
        lines += [
            f"## `{table.name}`",
            "",
            table.description,
            "",
            f"One file per {table.unit_of_work}; "
            + (f"partitioned by {', '.join(f'`{p}`' for p in table.partition_by)}." if table.partition_by else "a single file beside the data."),
            "",
            "| column | type | unit | nullable | meaning |",
            "|---|---|---|---|---|",
        ]
        for c in table.columns:
            lines.append(f"| `{c.name}` | {c.dtype} | {c.unit} | {'yes' if c.nullable else 'no'} | {c.meaning} |")
        lines.append("")
    return "\n".join(lines)
