"""The trials table: one row per bench trial, its columns the parts' (``TRIAL_PARTS``; ``_columns`` and
``_trial_parts`` declare them)."""

from __future__ import annotations


from sweep.store._columns import PROVENANCE, Column, Table
from sweep.store._task_columns import SPECULATION_COLUMNS, TASK_COLUMNS
from sweep.store._trial_parts import (
    AGREEMENT,
    IDENTITY,
    PROMPTS,
    REFERENCE,
    ROUNDS,
    SETTING,
    STOPPING,
    TIMING,
    WORKER,
)

# a trial's row, part by part, in the table's order: every column is declared once, in its part
TRIAL_PARTS: dict[str, tuple[Column, ...]] = {
    "provenance": PROVENANCE,  # the run, the model, the machine and the libraries
    "identity": IDENTITY,
    "setting": SETTING,
    "agreement": AGREEMENT,
    "timing": TIMING,
    "reference": REFERENCE,
    "speculation": SPECULATION_COLUMNS,  # self-speculation
    "worker": WORKER,
    "prompts": PROMPTS,
    "stopping": STOPPING,
    "rounds": ROUNDS,
    "task": TASK_COLUMNS,  # a task's accuracy
}

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
        "full-depth baselines (or any timed repeat) disagree is `nondeterministic`, never `ok`. A setting stopped "
        "early (`search.min_agreement`: its agreement's bootstrap interval over its first prompts ends below it) is "
        "`stopped`: its agreement over those prompts, nothing timed, never ranked."
    ),
    columns=tuple(column for part in TRIAL_PARTS.values() for column in part),
    cached=True,
)
