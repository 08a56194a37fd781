"""Task accuracy beside agreement (trials with ``eval.task``): fronts of the ranked speedup against accuracy, the best
speedup within an accuracy loss, and the EAS paper's table (arXiv 2603.23701 states its oracle bound as layers
skipped at <= 5% accuracy loss).

Every figure here ranks as the agreement tables do: the ranked ``speedup`` (``ranked``), full depth (1.0x, accuracy
loss 0) a candidate of every group that wins its ties. A group is a model, a task and its problem set (how many
problems, completions per problem): accuracies over other problems never share a front, nor a full depth's
accuracy. A setting stopped early on its accuracy loss (``accuracy_loss_min``) has no accuracy to rank; its group's
full depth still stands.
"""

from __future__ import annotations

import polars as pl

from sweep.analysis._pareto import FULL_DEPTH_ID, nondominated, params_text

LOSS_TARGETS = (0.01, 0.05)  # accuracy loss (full minus gated, a fraction) a target allows at most
# a group: the model, the task and its problem set (``problem_set``: how many problems the full-depth side scored,
# which a stopped setting's task_problems, the problems it ran, is not; completions per problem)
KEYS = ("model", "task", "problem_set", "task_samples")


def task_rows(ok: pl.DataFrame) -> pl.DataFrame:
    """The ok trials that measured a task against a finite full-depth accuracy, stopped ones included; empty
    without any."""
    if "task" not in ok.columns or not ok.height:
        return pl.DataFrame()
    missing = [pl.lit(None, pl.Int32).alias(k) for k in ("task_problems", "task_samples") if k not in ok.columns]
    rows = ok.with_columns(missing).filter(pl.col("task").is_not_null() & pl.col("accuracy_full").is_finite())
    full = pl.col("task_scores_full").list.len() if "task_scores_full" in ok.columns else pl.lit(None, pl.UInt32)
    return rows.with_columns(problem_set=pl.coalesce(full.cast(pl.Int64), pl.col("task_problems").cast(pl.Int64)))


def task_trials(ok: pl.DataFrame) -> pl.DataFrame:
    """The ok trials that measured a task (finite accuracy, loss and full-depth accuracy); empty without any."""
    rows = task_rows(ok)
    if not rows.height:
        return rows
    return rows.filter(pl.col("accuracy").is_finite() & pl.col("accuracy_loss").is_finite())


def stopped_task_rows(ok: pl.DataFrame) -> pl.DataFrame:
    """The ok trials whose task side stopped once its loss was certain to exceed search.max_accuracy_loss."""
    rows = task_rows(ok)
    if not rows.height or "accuracy_loss_min" not in rows.columns:
        return pl.DataFrame()
    return rows.filter(pl.col("accuracy_loss_min").is_not_null())


def _candidates(ok: pl.DataFrame) -> pl.DataFrame:
    """Every measured task trial, and per group full depth (from every task row, stopped ones too)."""
    rows = task_rows(ok)
    if not rows.height:
        return pl.DataFrame()
    return _with_full_depth(task_trials(ok), rows)


def _with_full_depth(rows: pl.DataFrame, every: pl.DataFrame) -> pl.DataFrame:
    """``rows`` plus, per group of ``every``, full depth: 1.0x at its own accuracy (the trials' accuracy_full), no
    loss, nothing skipped."""
    ref = (
        every.group_by(*KEYS)
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
    return pl.concat([rows, ref], how="diagonal_relaxed") if rows.height else ref


def accuracy_front(ok: pl.DataFrame) -> pl.DataFrame:
    """Per group, the settings not dominated in (ranked speedup max, accuracy max), full depth among them (a setting
    at 1.0x or below with full depth's accuracy gives way to it; one more accurate does not)."""
    rows = _candidates(ok)
    if not rows.height:
        return pl.DataFrame()
    tied = (pl.col("trial_id") != FULL_DEPTH_ID) & (pl.col("speedup") <= 1.0) & (pl.col("accuracy_loss").abs() <= 1e-12)
    return nondominated(rows.filter(~tied), "speedup", "accuracy", KEYS).sort([*KEYS, "speedup"])


def accuracy_targets(ok: pl.DataFrame, losses: tuple[float, ...] = LOSS_TARGETS) -> pl.DataFrame:
    """Per group and allowed loss: the setting with the highest ranked speedup whose accuracy loss (the point
    estimate, as the fronts rank) is at most that loss; full depth a candidate that wins ties. Ties among settings
    go to the lower loss, then trial_id."""
    rows = _candidates(ok)
    if not rows.height:
        return pl.DataFrame()
    rows = rows.with_columns(_reference=pl.col("trial_id") == FULL_DEPTH_ID)
    picks = []
    for loss in losses:
        picks.append(
            rows.filter(pl.col("accuracy_loss") <= loss + 1e-12)
            .sort(
                [*KEYS, "speedup", "_reference", "accuracy_loss", "trial_id"],
                descending=[False] * len(KEYS) + [True, True, False, False],
            )
            .unique(subset=list(KEYS), keep="first", maintain_order=True)
            .with_columns(max_loss=pl.lit(float(loss)))
        )
    return pl.concat(picks, how="diagonal_relaxed").drop("_reference").sort([*KEYS, "max_loss"])


def setting_name(row: dict) -> str:
    """A task trial as the tables name it: its gate and parameters (``params_text``), or full depth."""
    if row.get("trial_id") == FULL_DEPTH_ID:
        return "full depth"
    return f"{row.get('gate')} {params_text(row)}".strip()


def task_eas(ok: pl.DataFrame, eas: pl.DataFrame | None = None, oracle: pl.DataFrame | None = None) -> pl.DataFrame:
    """The EAS paper's table, per model and task: the share of layers skipped (``task_layers_saved``: the task's own
    completion tokens) by the measured setting that skips most at accuracy loss <= 5%, its speedup and loss; beside
    it, where the model was profiled, the oracle bound at agreement 1.0 (``oracle_bound``: the first-match exit on
    the trace) and EAS (hidden, logits, top-K)."""
    rows = _candidates(ok)
    if not rows.height:
        return pl.DataFrame()
    within = (  # a setting whose task tokens' layers were not counted is not read as another figure's
        rows.filter((pl.col("accuracy_loss") <= 0.05 + 1e-12) & pl.col("task_layers_saved").is_not_null())
        .with_columns(_reference=pl.col("trial_id") == FULL_DEPTH_ID)
        .sort(
            [*KEYS, "task_layers_saved", "_reference", "speedup", "trial_id"],
            descending=[False] * len(KEYS) + [True, True, True, False],
        )
        .unique(subset=list(KEYS), keep="first", maintain_order=True)
        .select(
            *KEYS,
            "task_metric",
            "accuracy_full",
            layers_skipped_5pct=pl.col("task_layers_saved"),
            setting=pl.col("trial_id"),
            name=pl.struct(pl.all()).map_elements(setting_name, return_dtype=pl.String),
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
