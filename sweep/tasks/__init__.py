"""Task accuracy beside agreement (``eval.task``): HumanEval pass@k with code run in a sandbox (``humaneval``,
``sandbox``), lm-evaluation-harness through the registered model ``sweep`` (``harness``), both sides of a trial's
evaluation (``evaluate``).

``COLUMNS``: the task columns a trial row carries (null without a task), by name; polars-free, so the GPU image's
bench reads them too. The trials table declares them (``sweep.store.TASK_COLUMNS``; a test keeps both equal).
"""

COLUMNS = (
    "task",
    "task_metric",
    "task_problems",
    "task_samples",
    "accuracy",
    "accuracy_lo",
    "accuracy_hi",
    "accuracy_full",
    "accuracy_loss",
    "accuracy_loss_lo",
    "accuracy_loss_hi",
    "accuracy_loss_min",
    "task_scores",
    "task_scores_full",
    "completions",
    "completions_full",
    "pass_at_k",
    "pass_at_k_full",
    "task_agreement",
    "task_exit_rate",
    "task_layers_saved",
    "sandbox",
    "task_seconds",
    "task_reference",
)
