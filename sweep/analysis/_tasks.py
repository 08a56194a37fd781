"""Task accuracy beside agreement (trials with ``eval.task``): fronts of the ranked speedup against accuracy, the best
speedup within an accuracy loss, and the EAS paper's table (arXiv 2603.23701 states its oracle bound as layers
skipped at <= 5% accuracy loss).

Every figure here ranks as the agreement tables do: the ranked ``speedup`` (``ranked``), full depth (1.0x, accuracy
loss 0) a candidate of every group that wins its ties. A group is a model and a task: accuracies of different tasks
never share a front.
"""

from __future__ import annotations

import polars as pl

from sweep.analysis._pareto import FULL_DEPTH_ID, nondominated

LOSS_TARGETS = (0.01, 0.05)  # accuracy loss (full minus gated, a fraction) a target allows at most
KEYS = ("model", "task")


def task_trials(ok: pl.DataFrame) -> pl.DataFrame:
    """The ok trials that measured a task (finite accuracy and loss); empty without any."""
    if "task" not in ok.columns or not ok.height:
        return pl.DataFrame()
    return ok.filter(
        pl.col("task").is_not_null() & pl.col("accuracy").is_finite() & pl.col("accuracy_loss").is_finite()
    )


def _with_full_depth(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` plus, per model and task, full depth: 1.0x at its own accuracy (the trials' accuracy_full), no
    loss, nothing skipped."""
    ref = (
        rows.group_by(*KEYS)
        .agg(pl.col("accuracy_full").first(), pl.col("task_metric").first())
        .with_columns(
            trial_id=pl.lit(FULL_DEPTH_ID),
            gate=pl.lit("full"),
            speedup=pl.lit(1.0),
            speedup_lo=pl.lit(1.0),
            speedup_hi=pl.lit(1.0),
            accuracy=pl.col("accuracy_full"),
            accuracy_loss=pl.lit(0.0),
            accuracy_loss_lo=pl.lit(0.0),
            accuracy_loss_hi=pl.lit(0.0),
            agreement=pl.lit(1.0),
            task_layers_saved=pl.lit(0.0),
            layers_saved=pl.lit(0.0),
        )
    )
    return pl.concat([rows, ref], how="diagonal_relaxed")


def accuracy_front(ok: pl.DataFrame) -> pl.DataFrame:
    """Per model and task, the settings not dominated in (ranked speedup max, accuracy max), full depth among them
    (a setting at 1.0x or below that loses no accuracy gives way to it)."""
    rows = task_trials(ok)
    if not rows.height:
        return pl.DataFrame()
    rows = _with_full_depth(rows)
    tied = (pl.col("trial_id") != FULL_DEPTH_ID) & (pl.col("speedup") <= 1.0) & (pl.col("accuracy_loss") <= 0.0)
    return nondominated(rows.filter(~tied), "speedup", "accuracy", KEYS).sort([*KEYS, "speedup"])


def accuracy_targets(ok: pl.DataFrame, losses: tuple[float, ...] = LOSS_TARGETS) -> pl.DataFrame:
    """Per model, task and allowed loss: the setting with the highest ranked speedup whose accuracy loss (the point
    estimate, as the fronts rank) is at most that loss; full depth a candidate that wins ties. Ties among settings
    go to the lower loss, then trial_id."""
    rows = task_trials(ok)
    if not rows.height:
        return pl.DataFrame()
    rows = _with_full_depth(rows).with_columns(_reference=pl.col("trial_id") == FULL_DEPTH_ID)
    picks = []
    for loss in losses:
        picks.append(
            rows.filter(pl.col("accuracy_loss") <= loss + 1e-12)
            .sort(
                [*KEYS, "speedup", "_reference", "accuracy_loss", "trial_id"],
                descending=[False, False, True, True, False, False],
            )
            .unique(subset=list(KEYS), keep="first", maintain_order=True)
            .with_columns(max_loss=pl.lit(float(loss)))
        )
    return pl.concat(picks, how="diagonal_relaxed").drop("_reference").sort([*KEYS, "max_loss"])


def task_eas(ok: pl.DataFrame, eas: pl.DataFrame | None = None, oracle: pl.DataFrame | None = None) -> pl.DataFrame:
    """The EAS paper's table, per model and task: the share of layers skipped (``task_layers_saved``: the task's own
    completion tokens) by the measured setting that skips most at accuracy loss <= 5%, its speedup and loss; beside
    it, where the model was profiled, the oracle bound at agreement 1.0 (``oracle_bound``: the first-match exit on
    the trace) and EAS (hidden, logits, top-K)."""
    rows = task_trials(ok)
    if not rows.height:
        return pl.DataFrame()
    within = (
        _with_full_depth(rows)
        .filter(pl.col("accuracy_loss") <= 0.05 + 1e-12)
        .with_columns(pl.col("task_layers_saved").fill_null(pl.col("layers_saved")).fill_null(0.0))
        .sort([*KEYS, "task_layers_saved", "speedup", "trial_id"], descending=[False, False, True, True, False])
        .unique(subset=list(KEYS), keep="first", maintain_order=True)
        .select(
            *KEYS,
            "task_metric",
            "accuracy_full",
            layers_skipped_5pct=pl.col("task_layers_saved"),
            setting=pl.col("trial_id"),
            speedup=pl.col("speedup"),
            accuracy_loss=pl.col("accuracy_loss"),
        )
    )
    if oracle is not None and oracle.height:
        within = within.join(oracle.select("model", oracle_skippable=pl.col("skippable")), on="model", how="left")
    if eas is not None and eas.height:
        wide = eas.pivot(on="variant", index="model", values="eas")
        wide = wide.rename({c: f"eas_{c}" for c in wide.columns if c != "model"})
        within = within.join(wide, on="model", how="left")
    return within.sort(list(KEYS))
