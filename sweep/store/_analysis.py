"""The tables `sweep analyze` derives from trials: Pareto fronts, knees and best-at-target picks,
with the ranked speedup and confidence columns they share (see ``_columns`` for the building blocks)."""

from __future__ import annotations

import dataclasses

import polars as pl

from sweep.store._columns import GATE_FIELDS, Column, Table, metric
from sweep.store._trials import TRIALS

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
        "speedup_floor",
        pl.Float64(),
        "fraction",
        "the noise floor of speedup_metric (the trial's noise_floor, or noise_floor_e2e for speedup_e2e_wall): "
        "within [1/(1+f), 1+f] a speedup cannot be told from 1.0; null without an A/A control",
        nullable=True,
    ),
    Column(
        "speedup",
        pl.Float64(),
        "ratio",
        "the ranked speedup (sweep.bench.estimators.ranked_speedup; an Optuna objective on speedup_wall is the same): "
        "speedup_metric's "
        "value, capped at 1.0 from above where the trial skipped no compute (a measured slowdown stays: its probes "
        "and heads cost real time), then 1.0 where it lies inside speedup_floor (within_noise)",
    ),
    Column(
        "capped",
        pl.Boolean(),
        "",
        "the trial skipped no compute and measured above 1.0: that ratio is timing noise, so `speedup` is 1.0",
    ),
    Column(
        "within_noise",
        pl.Boolean(),
        "",
        "the (capped) speedup lies inside speedup_floor: indistinguishable from 1.0, so `speedup` is 1.0; null "
        "without a floor",
        nullable=True,
    ),
    Column(
        "speedup_noise",
        pl.Float64(),
        "ratio",
        "trials that skipped no compute: their measured speedup_metric (above 1.0 timing noise; below 1.0 the real "
        "cost of their probes, heads and K/V work, kept in `speedup`); null otherwise",
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
        "rounds of summed baseline ms / summed gated ms; prefill added for speedup_e2e_wall), ranked as `speedup` "
        "is (capped where no compute was skipped, 1.0 inside speedup_floor)",
    ),
    metric("speedup_hi", "ratio", "upper end of the bootstrap interval of `speedup`"),
    metric(
        "ci_level", "fraction", "confidence level of the intervals (0.95); null when the row has no per-prompt values"
    ),
    Column("ci_prompts", pl.Int32(), "prompts", "prompts the agreement interval was resampled from", nullable=True),
    Column(
        "ci_units",
        pl.Int32(),
        "units",
        "units the speedup interval was resampled from: the prompts, or the batches of a batched trial (its timings "
        "are per batch)",
        nullable=True,
    ),
    Column(
        "ci_few_prompts",
        pl.Boolean(),
        "",
        "ci_prompts or ci_units < analysis.ci_min_prompts (default 8): an interval is too coarse to trust",
        nullable=True,
    ),
)

FRONT = Column(
    "front",
    pl.String(),
    "",
    "which Pareto front: `model` (all gates of the model) or `model+gate` (one gate's trials); with `model` "
    "and front_gate it names the front, and with trial_id it joins `knees` to `pareto`",
)

FRONT_GATE = Column(
    "front_gate",
    pl.String(),
    "",
    "the gate whose `model+gate` front the row is on; null on a `model` front (`gate` is the row's own: `full` for "
    "the full-depth reference)",
    nullable=True,
)

REFERENCE_KEEPS = ("schema_version", "created_at", "model", "trial_id", "gate", "status")  # set on the reference row

PARETO = Table(
    name="pareto",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/pareto/pareto.parquet: the rows on a Pareto front of `speedup` "
        "(max; the ranked speedup) against agreement (max), over `status == ok` rows and the full-depth reference. "
        "Full depth (trial_id `full-depth`, gate `full`, source `reference`: 1.0x at agreement 1.0, always available) "
        "is a candidate on every front, so a setting it dominates is on none, a setting that only ties it (1.0x at "
        "agreement 1.0) gives way to it, and it is on a front unless a setting at agreement 1.0 ranks above 1x; its "
        "trial columns other than those it sets are null. A trial on both fronts is two rows, told apart by "
        "`front`: `model` (all gates of a model) or `model+gate` (named by front_gate). "
        "Every column of `trials`, plus the ones below."
    ),
    columns=tuple(c if c.name in REFERENCE_KEEPS else dataclasses.replace(c, nullable=True) for c in TRIALS.columns)
    + (FRONT, FRONT_GATE)
    + RANKED
    + CONFIDENCE,
    single_file=True,
)

_TRIAL_COLUMNS = {c.name: c for c in TRIALS.columns}


def _nullable(*columns: Column) -> tuple[Column, ...]:
    return tuple(dataclasses.replace(c, nullable=True) for c in columns)


KNEES = Table(
    name="knees",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/knees/knees.parquet: one row per front (`front`, `model`, "
        "front_gate) of at least 3 points (fewer have no bend), the full-depth reference counted. The knee by the "
        "chord method on (`speedup`, agreement) over the front points with agreement >= knee_min_agreement "
        "(analysis.knee_min_agreement, default 0.9: a knee at agreement 0.01 is right by the chord and of no use): "
        "both axes min-max normalised over those points, the point farthest from the line joining their extremes "
        "(ties: higher agreement, then trial_id); null when fewer than 3 points reach it. With 12 or more such "
        "points, the Kneedle knee (Satopaa et al. 2011: concave, decreasing, sensitivity 1, as the `kneed` "
        "package finds it) as a cross-check. The unrestricted knee "
        "(all front points) in knee_all_*. `gate` and the setting columns are the knee row's own, typed as in "
        "`trials`; join to `pareto` on (trial_id, front), to `trials` on trial_id."
    ),
    columns=(
        Column("schema_version", pl.Int32(), "", "version of this schema"),
        Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the file was written"),
        FRONT,
        FRONT_GATE,
        Column("model", pl.String(), "", "model label"),
        Column("front_points", pl.Int32(), "trials", "rows on the front (the full-depth reference included)"),
        Column("knee_min_agreement", pl.Float64(), "fraction", "the agreement a knee candidate needs"),
        Column("knee_points", pl.Int32(), "trials", "front points with agreement >= knee_min_agreement"),
        Column(
            "trial_id",
            pl.String(),
            "",
            "the knee (chord method over the knee_points); null when fewer than 3",
            nullable=True,
        ),
    )
    + _nullable(*GATE_FIELDS)
    + _nullable(*(_TRIAL_COLUMNS[name] for name in ("kv_policy", "mode", "draft_len", "batch_size")))
    + (
        Column(
            "params",
            pl.String(),
            "",
            "the knee trial's gate parameters (and bench mode, draft_len, draft_stop, batch_size when not the "
            "default), as key=value text for display",
            nullable=True,
        ),
        Column("speedup_metric", pl.String(), "", "what `speedup` ranks by: speedup_wall | speedup_e2e_wall"),
        Column("speedup", pl.Float64(), "ratio", "the knee's ranked speedup (see `pareto`)", nullable=True),
        Column("speedup_wall", pl.Float64(), "ratio", "the knee's measured speedup_wall", nullable=True),
        Column("agreement", pl.Float64(), "fraction", "the knee's agreement", nullable=True),
        Column(
            "kneedle_trial_id",
            pl.String(),
            "",
            "the Kneedle knee over the knee_points (12+ of them and kneed found one); else null",
            nullable=True,
        ),
        Column("kneedle_speedup", pl.Float64(), "ratio", "the Kneedle knee's ranked speedup", nullable=True),
        Column("kneedle_agreement", pl.Float64(), "fraction", "the Kneedle knee's agreement", nullable=True),
        Column("knee_all_trial_id", pl.String(), "", "the unrestricted knee: chord method over every front point"),
        Column("knee_all_gate", pl.String(), "", "the unrestricted knee's gate (`full` for the full-depth reference)"),
        Column("knee_all_params", pl.String(), "", "the unrestricted knee's parameters, as key=value text"),
        Column("knee_all_speedup", pl.Float64(), "ratio", "the unrestricted knee's ranked speedup"),
        Column("knee_all_agreement", pl.Float64(), "fraction", "the unrestricted knee's agreement"),
    ),
    single_file=True,
)

TARGETS = Table(
    name="targets",
    partition_by=(),
    unit_of_work="`sweep analyze` run (replaced each time)",
    description=(
        "Written by `sweep analyze` as <results.root>/targets/targets.parquet: per model and agreement target, the "
        "`ok` trial with the highest ranked `speedup` among those with agreement >= target, full depth included "
        "(trial_id `full-depth`, gate `full`: 1.0x at agreement 1.0, so it reaches every target and wins its ties; "
        "ties among trials: higher measured speedup, then higher agreement, then trial_id). A row names a setting "
        "only where one beats full depth."
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
            "its gate parameters (and bench mode, draft_len, draft_stop, batch_size when not the default), "
            "as key=value text",
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
