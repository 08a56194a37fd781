"""The profile trace and the tables derived from trials: simulated settings, Pareto fronts,
knees and best-at-target picks (see ``_columns`` for the building blocks)."""

from __future__ import annotations

import dataclasses

import polars as pl

from sweep.store._columns import GATE_FIELDS, PROVENANCE, Column, Table, metric
from sweep.store._trials import TRIALS

PROFILE = Table(
    name="profile",
    partition_by=("model",),
    unit_of_work="one `sweep profile` run (all its prompts)",
    description=(
        "Per-layer trace of greedy full-depth decoding: one row per (prompt, position, layer). "
        "Position p's hidden states predict the token at p+1; `phase` says whether p was part of the "
        "prompt (prefill) or a generated token fed back (decode). Layers are 1-indexed; layer L is full depth. "
        "All positions of a prompt are captured while decoding, by the forwards the engine runs: a prefill of the "
        "prompt, "
        "then one KV-cached step per generated token (the gates' signals are the ones the engine computes, in any "
        "dtype)."
    ),
    columns=PROVENANCE
    + (
        Column("prompt_id", pl.String(), "", "prompt id within its set (chat/3, HumanEval/0, a JSONL id)"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("position", pl.Int32(), "tokens", "0-based position in prompt + generation"),
        Column("phase", pl.String(), "", "prefill | decode"),
        Column("layer", pl.Int32(), "", "exit layer l in 1..L (layers 1..l ran)"),
        Column("token_id", pl.Int64(), "", "input token at this position (rebuilds the sequence)"),
        Column(
            "delta", pl.Float64(), "ratio", "saturation delta ||h_l - h_{l-1}||_2 / ||h_l||_2 (h_0 = embedding output)"
        ),
        Column("margin", pl.Float64(), "logits", "gamma_l: top1 - top2 of z_l = lm_head(final_norm(h_l))"),
        Column("top1", pl.Int64(), "", "argmax of z_l"),
        Column("top1_final", pl.Int64(), "", "argmax of z_L (the model's greedy token)"),
        Column("top1_match", pl.Boolean(), "", "top1 == top1_final"),
        Column("residual_inf", pl.Float64(), "logits", "tau_l: ||z_l - z_L||_inf"),
        Column("cos_hidden", pl.Float64(), "", "cosine of final_norm(h_l) and final_norm(h_L)"),
        Column(
            "cos_logits",
            pl.Float64(),
            "",
            "cosine of the mean-centred logits z_l and z_L (softmax ignores a constant shift; raw logit cosines are "
            "dominated by it)",
        ),
        Column("topk_overlap", pl.Float64(), "fraction", "|topK(z_l) & topK(z_L)| / K"),
        Column("topk", pl.Int32(), "tokens", "K of topk_overlap"),
        Column(
            "prob_margin",
            pl.Float64(),
            "probability",
            "top-1 minus top-2 probability of softmax(z_l) (CALM's softmax response)",
            nullable=True,
        ),
        Column("entropy", pl.Float64(), "nats", "entropy of softmax(z_l)", nullable=True),
        Column(
            "cos_prev",
            pl.Float64(),
            "",
            "cosine of h_l and h_{l-1} (CALM's hidden-state saturation; h_0 = embedding output)",
            nullable=True,
        ),
        Column(
            "pca_delta",
            pl.Float64(),
            "ratio",
            "||P n_l - P n_{l-1}|| / ||P n_l||, n = final_norm(h), P = the lm_head's top pca_k principal directions",
            nullable=True,
        ),
        Column("pca_k", pl.Int32(), "directions", "k of pca_delta", nullable=True),
        Column(
            "kl_final",
            pl.Float64(),
            "nats",
            "KL(softmax(z_L) || softmax(z_l)): the logit lens's distance",
            nullable=True,
        ),
        # with profile.readouts (`sweep fit`'s file): the tuned lens and the exit classifiers, as the gates read them
        Column(
            "readouts_id", pl.String(), "", "the readouts the tuned_* and classifier columns come from", nullable=True
        ),
        Column(
            "tuned_top1", pl.Int64(), "", "argmax of the tuned lens t_l = lm_head(final_norm(T_l h_l))", nullable=True
        ),
        Column("tuned_match", pl.Boolean(), "", "tuned_top1 == top1_final", nullable=True),
        Column("tuned_margin", pl.Float64(), "logits", "top1 - top2 of t_l", nullable=True),
        Column(
            "tuned_prob_margin",
            pl.Float64(),
            "probability",
            "top-1 minus top-2 probability of softmax(t_l)",
            nullable=True,
        ),
        Column("tuned_entropy", pl.Float64(), "nats", "entropy of softmax(t_l)", nullable=True),
        Column("tuned_residual_inf", pl.Float64(), "logits", "||t_l - z_L||_inf", nullable=True),
        Column("tuned_kl_final", pl.Float64(), "nats", "KL(softmax(z_L) || softmax(t_l))", nullable=True),
        Column(
            "classifier_prob",
            pl.Float64(),
            "probability",
            "the exit classifier's p(top-1 of the logit lens at l is the final one)",
            nullable=True,
        ),
        Column(
            "tuned_classifier_prob",
            pl.Float64(),
            "probability",
            "the exit classifier's p(top-1 of the tuned lens at l is the final one)",
            nullable=True,
        ),
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
        Column(
            "agreement_tf", pl.Float64(), "fraction", "teacher-forced agreement: exited top-1 equals the final top-1"
        ),
        Column("exit_rate", pl.Float64(), "fraction", "decision positions that exit before layer L"),
        Column("mean_exit_layer", pl.Float64(), "layers", "mean exit layer (L when not exited)"),
        Column("speedup_model", pl.Float64(), "ratio", "speedup the measured cost model predicts on decode positions"),
        Column(
            "on_front",
            pl.Boolean(),
            "",
            "on the simulated Pareto front (speedup_model against agreement_tf, per model)",
        ),
        Column("selected", pl.Boolean(), "", "run closed-loop: on the front or next to its knee"),
    ),
)

RANKED: tuple[Column, ...] = (
    Column(
        "speedup_metric",
        pl.String(),
        "",
        "what `speedup` ranks by (analysis.speedup): speedup_wall (decode) | speedup_e2e_wall (whole requests)",
    ),
    Column(
        "skipped_compute",
        pl.Boolean(),
        "",
        "the trial skipped decoder-layer work: self_speculative, or decode steps that exited (step_layers_saved > 0) "
        "under a kv_policy other than full",
    ),
    Column(
        "speedup",
        pl.Float64(),
        "ratio",
        "the ranked speedup: speedup_metric's value where skipped_compute, else 1.0 by construction (its measured "
        "ratio is timing noise)",
    ),
    Column(
        "speedup_noise",
        pl.Float64(),
        "ratio",
        "trials that skipped no compute: their measured speedup_metric (noise around 1); null otherwise",
        nullable=True,
    ),
)

CONFIDENCE: tuple[Column, ...] = (
    metric(
        "agreement_lo",
        "fraction",
        "lower end of the bootstrap interval of agreement: prompts resampled with replacement, the mean of "
        "per-prompt agreement on each resample (level in ci_level; generator seeded from analysis.seed and trial_id)",
    ),
    metric("agreement_hi", "fraction", "upper end of the bootstrap interval of agreement"),
    metric(
        "speedup_lo",
        "ratio",
        "lower end of the bootstrap interval of `speedup`: units (prompts, or batches) and timed rounds resampled "
        "with replacement from the round_* timings, and on each resample the bench's own estimator (median over "
        "rounds of summed baseline ms / summed gated ms; prefill added for speedup_e2e_wall); 1.0 where no compute "
        "was skipped",
    ),
    metric("speedup_hi", "ratio", "upper end of the bootstrap interval of `speedup`"),
    metric(
        "ci_level", "fraction", "confidence level of the intervals (0.95); null when the row has no per-prompt values"
    ),
    Column("ci_prompts", pl.Int32(), "prompts", "prompts the intervals were resampled from", nullable=True),
    Column(
        "ci_few_prompts",
        pl.Boolean(),
        "",
        "ci_prompts < analysis.ci_min_prompts (default 8): the interval is too coarse to trust",
        nullable=True,
    ),
)

FRONT = Column(
    "front",
    pl.String(),
    "",
    "which Pareto front: `model` (all gates of the model) or `model+gate` (one gate's trials); with `model` "
    "(and `gate` for model+gate) it names the front, and with trial_id it joins `knees` to `pareto`",
)

PARETO = Table(
    name="pareto",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/pareto/pareto.parquet: the trials on a Pareto front "
        "of `speedup` (max; speedup_metric where the trial skipped compute, else 1.0) against agreement (max), over "
        "`status == ok` rows. A trial on both fronts is two rows, told apart by `front`: `model` (all gates of a "
        "model) or `model+gate`; `gate` is always the trial's own. Every column of `trials`, plus the ones below."
    ),
    columns=TRIALS.columns + (FRONT,) + RANKED + CONFIDENCE,
    single_file=True,
)

_TRIAL_COLUMNS = {c.name: c for c in TRIALS.columns}

KNEES = Table(
    name="knees",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/knees/knees.parquet: one row per front (`front`, `model`, and "
        "for a `model+gate` front its gate) of at least 3 points (fewer have no bend). The knee by the chord method "
        "on (`speedup`, agreement): both axes min-max normalised over the front, the point farthest from the line "
        "joining the front's extremes (ties: higher agreement, then trial_id). With 12 or more front points, the "
        "Kneedle knee (Satopaa et al. 2011: concave, decreasing, sensitivity 1, as the `kneed` package finds it) as a "
        "cross-check. `gate` and the setting columns "
        "are the knee trial's own, typed as in `trials`; join to `pareto` on (trial_id, front), to `trials` on "
        "trial_id."
    ),
    columns=(
        Column("schema_version", pl.Int32(), "", "version of this schema"),
        Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the file was written"),
        FRONT,
        Column("model", pl.String(), "", "model label"),
        Column("front_points", pl.Int32(), "trials", "trials on the front"),
        Column("trial_id", pl.String(), "", "the knee trial (chord method)"),
    )
    + GATE_FIELDS
    + tuple(_TRIAL_COLUMNS[name] for name in ("kv_policy", "mode", "draft_len", "batch_size"))
    + (
        Column(
            "params",
            pl.String(),
            "",
            "the knee trial's gate parameters (and bench mode, draft_len, batch_size when not the default), as "
            "key=value text for display",
        ),
        Column("speedup_metric", pl.String(), "", "what `speedup` ranks by: speedup_wall | speedup_e2e_wall"),
        Column("speedup", pl.Float64(), "ratio", "the knee's ranked speedup (see `pareto`)"),
        Column("speedup_wall", pl.Float64(), "ratio", "the knee's measured speedup_wall"),
        Column("agreement", pl.Float64(), "fraction", "the knee's agreement"),
        Column(
            "kneedle_trial_id",
            pl.String(),
            "",
            "the Kneedle knee (12+ points and Kneedle found one); else null",
            nullable=True,
        ),
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
        "Written by `sweep analyze` as <results.root>/targets/targets.parquet: per model and agreement target, the "
        "`ok` trial with the highest ranked `speedup` among those with agreement >= target (ties: higher agreement, "
        "then trial_id); trial columns null when no trial reaches the target."
    ),
    columns=(
        Column("schema_version", pl.Int32(), "", "version of this schema"),
        Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the file was written"),
        Column("model", pl.String(), "", "model label"),
        Column("target", pl.Float64(), "fraction", "the agreement target"),
        Column("trial_id", pl.String(), "", "the best trial, null when none reaches the target", nullable=True),
        Column("gate", pl.String(), "", "its gate", nullable=True),
        Column(
            "params",
            pl.String(),
            "",
            "its gate parameters (and bench mode, draft_len, batch_size when not the default), as key=value text",
            nullable=True,
        ),
        Column("mode", pl.String(), "", "its bench mode: early_exit | self_speculative", nullable=True),
        Column("speedup_wall", pl.Float64(), "ratio", "its measured speedup_wall", nullable=True),
        Column("speedup_e2e_wall", pl.Float64(), "ratio", "its measured speedup_e2e_wall", nullable=True),
        Column("agreement", pl.Float64(), "fraction", "its agreement", nullable=True),
        Column(
            "exit_rate",
            pl.Float64(),
            "fraction",
            "fraction of its generated tokens that exited before layer L (self_speculative: 0, its tokens are all "
            "the full model's)",
            nullable=True,
        ),
        Column(
            "acceptance_rate",
            pl.Float64(),
            "fraction",
            "self_speculative: drafted tokens the full model accepted; null otherwise",
            nullable=True,
        ),
    )
    + tuple(dataclasses.replace(c, nullable=True) for c in RANKED)
    + CONFIDENCE,
    single_file=True,
)
