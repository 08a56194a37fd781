"""Pareto fronts of speedup against agreement, their knees, and the best trial per target.

Every function ranks by the ``speedup`` column of ``ranked`` (capped at 1.0 from above where no
compute was skipped, 1.0 inside the trial's noise floor), so timing noise never wins a front.
Full depth, at 1.0x and agreement 1.0, is always available to a user: it is a candidate on
every front and at every target (``FULL_DEPTH_ID``), so a setting it dominates is on no front, a
setting that only ties it loses to it, and it leaves a front only where a setting at agreement 1.0
ranks above 1x.
"""

from __future__ import annotations

import math

import polars as pl

from sweep.analysis._confidence import ranked
from sweep.analysis._kneedle import kneedle
from sweep.gates import gate_text

TARGETS = (0.95, 0.98, 0.99, 1.0)
KNEE_MIN_POINTS = 3  # a knee is a bend: fewer front points have none
KNEE_MIN_AGREEMENT = 0.9  # analysis.knee_min_agreement's default: knees among front points this accurate
FULL_DEPTH_ID = "full-depth"  # the trial_id of the full-depth reference (1.0x, agreement 1.0)


def counted(metric: str = "speedup_wall", y: str = "agreement") -> pl.Expr:
    """An ok row that counts: the metric finite and above 0 (a ratio of times; a NaN would rank above every number)
    and ``y`` finite."""
    return (pl.col("status") == "ok") & pl.col(metric).is_finite() & (pl.col(metric) > 0) & pl.col(y).is_finite()


def ok_trials(
    trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall", y: str = "agreement", *, ranks: bool = False
) -> pl.LazyFrame:
    """Rows that count (``counted``), with the ranked speedup columns (``ranked``); with ``ranks``, only those the
    tables rank (``best_timed``: a setting timed again over more rounds by that row alone)."""
    ok = trials.lazy().filter(counted(metric, y))
    return ranked(best_timed(ok) if ranks else ok, metric)


def best_timed(ok: pl.LazyFrame) -> pl.LazyFrame:
    """One row of each setting measured more than once over different numbers of timed rounds (trial keys equal but
    for bench.repeats: a search's row and its re-time to the floor target, or the same bench run with more rounds):
    the ones whose key asks for the most rounds. Ranking every measurement of a setting would let its luckiest,
    least-timed draw win a front. Rows without a JSON trial key, and rows of one key, are kept as they are."""
    if "trial_key" not in ok.collect_schema().names():
        return ok
    key = pl.col("trial_key")
    json = key.str.starts_with("{")
    setting = pl.when(json).then(key.str.replace_all(r'"repeats":\d+', '"repeats":*'))
    rounds = pl.when(json).then(key.str.extract(r'"repeats":(\d+)').cast(pl.Int64, strict=False))
    most = pl.col("_rounds").max().over("_setting")
    keep = pl.col("_setting").is_null() | pl.col("_rounds").is_null() | (pl.col("_rounds") == most)
    return ok.with_columns(_setting=setting, _rounds=rounds).filter(keep).drop("_setting", "_rounds")


def full_depth(groups: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall", y: str = "agreement") -> pl.LazyFrame:
    """The full-depth reference, one row per row of ``groups`` (its key columns): trial_id
    ``FULL_DEPTH_ID``, gate ``full`` (unless ``gate`` is a key), source ``reference``, 1.0x on every
    speedup, agreement 1.0, nothing exited; its intervals 1.0-1.0 (it is the definition of 1.0)."""
    keys = groups.lazy().collect_schema().names()
    one = pl.lit(1.0, pl.Float64)
    values = {
        "trial_id": pl.lit(FULL_DEPTH_ID),
        "gate": pl.lit("full"),
        "source": pl.lit("reference"),
        "status": pl.lit("ok"),
        "mode": pl.lit("early_exit"),
        "speedup_metric": pl.lit(metric),
        "skipped_compute": pl.lit(False),
        "capped": pl.lit(False),
        "within_noise": pl.lit(None, pl.Boolean),
        **{c: one for c in ("speedup", "speedup_wall", "speedup_e2e_wall", "speedup_model", "speedup_e2e_model")},
        **{c: one for c in ("agreement", "prefix_agreement", "exact_match", y)},
        **{c: pl.lit(0.0, pl.Float64) for c in ("exit_rate", "layers_saved", "step_layers_saved")},
        **{c: one for c in ("speedup_lo", "speedup_hi", "agreement_lo", "agreement_hi")},
    }
    return groups.lazy().unique().with_columns(**{k: v for k, v in values.items() if k not in keys})


def pareto_front(
    trials: pl.DataFrame | pl.LazyFrame,
    metric: str = "speedup_wall",
    y: str = "agreement",
    by: tuple[str, ...] = (),
    *,
    reference: bool = True,
) -> pl.DataFrame:
    """Rows of ``status == ok`` not dominated in (speedup max, y max), per group ``by``; ``speedup``
    is the ranked one (``ranked``). With ``reference`` (the default) each group's front includes full
    depth (``full_depth``): a setting it dominates is not on it, and one that ties it (1.0x at y 1.0)
    gives way to it."""
    ok = ok_trials(trials, metric, y, ranks=True)
    if not reference:
        return nondominated(ok, "speedup", y, by)
    ref = full_depth(ok.select(list(by)) if by else pl.LazyFrame({"_group": [0]}), metric, y)
    rows = pl.concat([ok, ref.drop("_group", strict=False)], how="diagonal_relaxed")
    tied = (pl.col("trial_id") != FULL_DEPTH_ID) & (pl.col("speedup") <= 1.0) & (pl.col(y) >= 1.0)
    return nondominated(rows.filter(~tied), "speedup", y, by)


def nondominated(rows: pl.DataFrame | pl.LazyFrame, x: str, y: str, by: tuple[str, ...] = ()) -> pl.DataFrame:
    """Rows not dominated in (x max, y max), per group ``by``.

    A row is dominated when another has x and y at least as large and one of them
    strictly larger; rows tied on both are all kept. Sorted by group, then x descending.
    A row survives iff its y is the largest among rows with its x, and larger than
    every y among rows with a larger x.
    """
    keys, rows = list(by), rows.lazy()
    per_x = (
        rows.group_by([*keys, x])
        .agg(_y_at_x=pl.col(y).max())
        .sort([*keys, x], descending=[False] * len(keys) + [True])
        .with_columns(_y_beyond=_over(pl.col("_y_at_x").cum_max().shift(1), keys))
    )
    front = rows.join(per_x, on=[*keys, x], how="inner", nulls_equal=True).filter(
        (pl.col(y) == pl.col("_y_at_x")) & (pl.col("_y_beyond").is_null() | (pl.col(y) > pl.col("_y_beyond")))
    )
    return (
        front.drop("_y_at_x", "_y_beyond")
        .sort([*keys, x, "trial_id"], descending=[False] * len(keys) + [True, False])
        .collect()
    )


def chord_knees(
    front: pl.DataFrame | pl.LazyFrame,
    by: tuple[str, ...],
    x: str = "speedup",
    y: str = "agreement",
    min_points: int = KNEE_MIN_POINTS,
) -> pl.DataFrame:
    """The knee of each front of at least ``min_points`` points by the chord method, with the
    number of front points.

    Both axes are min-max normalised within the front (an axis with no spread maps to
    0.5); the knee is the point farthest from the line joining the front's extremes,
    (0, 1) and (1, 0), i.e. with the largest |x_n + y_n - 1|. Ties go to the higher
    agreement, then the smaller trial_id. Smaller fronts have no knee (no row).
    """
    keys = list(by)

    def norm(col: str) -> pl.Expr:
        lo, hi = _over(pl.col(col).min(), keys), _over(pl.col(col).max(), keys)
        return pl.when(hi > lo).then((pl.col(col) - lo) / (hi - lo)).otherwise(0.5)

    scored = front.lazy().with_columns(
        _dist=(norm(x) + norm(y) - 1.0).abs() / math.sqrt(2.0),
        front_points=_over(pl.len(), keys).cast(pl.Int32),
    )
    order = scored.filter(pl.col("front_points") >= min_points).sort(
        [*keys, "_dist", y, "trial_id"], descending=[False] * len(keys) + [True, True, False]
    )
    first = order.unique(subset=keys, keep="first", maintain_order=True).sort(keys) if keys else order.head(1)
    return first.drop("_dist").collect()


def kneedle_knee(front: pl.DataFrame, x: str = "speedup", y: str = "agreement", min_points: int = 12) -> dict | None:
    """The Kneedle knee of one front (concave and decreasing: ``_kneedle``, as ``kneed`` finds it), as its
    row; None when the front has fewer than ``min_points`` points or Kneedle finds no knee."""
    if front.height < min_points:
        return None
    pts = front.sort(x, "trial_id")
    xs, ys = pts[x].to_list(), pts[y].to_list()
    if len(set(xs)) < 3:
        return None
    knee = kneedle(xs, ys)
    if knee is None:
        return None
    return pts.filter(pl.col(x) == knee).row(0, named=True)


def knees_table(
    fronts: pl.DataFrame, min_points: int = KNEE_MIN_POINTS, min_agreement: float = KNEE_MIN_AGREEMENT
) -> pl.DataFrame:
    """One knee row per front (``front``, model, ``front_gate``) of at least ``min_points`` points: the
    chord knee over the front points with agreement >= ``min_agreement`` (null when fewer than
    ``min_points`` reach it: a knee at agreement 0.01 is right by the chord and of no use), the Kneedle
    cross-check over the same points, and the unrestricted knee over all of them (``knee_all_*``).
    ``gate`` and the setting columns are the knee trial's own (typed as in ``trials``): join to the fronts
    on (trial_id, front)."""
    from sweep.store import TABLES

    names = [c.name for c in TABLES["knees"].columns if c.name not in ("schema_version", "created_at")]
    schema = {c.name: c.dtype for c in TABLES["knees"].columns if c.name in names}
    rows = []
    keyed = fronts if "front_gate" in fronts.columns else fronts.with_columns(front_gate=pl.lit(None, pl.String))
    for _, front in keyed.partition_by(["front", "model", "front_gate"], as_dict=True, maintain_order=True).items():
        if front.height < min_points:
            continue
        whole = chord_knees(front, by=(), min_points=min_points).row(0, named=True)
        useful = front.filter(pl.col("agreement") >= min_agreement)
        found = chord_knees(useful, by=(), min_points=min_points)
        knee = found.row(0, named=True) if found.height else {}
        cross = kneedle_knee(useful) if knee else None
        row = {name: knee.get(name) for name in names}
        row.update(
            front=whole["front"],
            model=whole["model"],
            front_gate=whole.get("front_gate"),
            front_points=front.height,
            knee_min_agreement=float(min_agreement),
            knee_points=useful.height,
            speedup_metric=whole.get("speedup_metric"),
            params=params_text(knee) if knee else None,
            kneedle_trial_id=cross["trial_id"] if cross else None,
            kneedle_speedup=cross["speedup"] if cross else None,
            kneedle_agreement=cross["agreement"] if cross else None,
            knee_all_trial_id=whole["trial_id"],
            knee_all_gate=whole["gate"],
            knee_all_params=params_text(whole),
            knee_all_speedup=whole["speedup"],
            knee_all_agreement=whole["agreement"],
        )
        rows.append(row)
    return pl.DataFrame(rows, schema=schema).sort("front", "model", "front_gate", nulls_last=False)


def front_gate() -> pl.Expr:
    """The gate that names a front: the ``front_gate`` column (the gate of a ``model+gate`` front,
    null on a ``model`` front); ``gate`` is each row's own (``full`` for the full-depth reference)."""
    return pl.col("front_gate")


def fronts(
    trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall", *, reference: bool = True
) -> pl.DataFrame:
    """Both fronts the report uses, told apart by ``front``: per model across gates (``model``) and
    per (model, gate) (``model+gate``, named by ``front_gate``); ``gate`` stays each row's own. With
    ``reference``, full depth is a candidate on every one of them (``pareto_front``)."""
    rows = trials.lazy()
    across = pareto_front(rows, metric, by=("model",), reference=reference).with_columns(
        front=pl.lit("model"), front_gate=pl.lit(None, pl.String)
    )
    per_gate = pareto_front(
        rows.with_columns(front_gate=pl.col("gate")), metric, by=("model", "front_gate"), reference=reference
    ).with_columns(front=pl.lit("model+gate"))
    return pl.concat([across, per_gate], how="diagonal_relaxed")


def best_at_targets(
    trials: pl.DataFrame | pl.LazyFrame,
    targets: tuple[float, ...] = TARGETS,
    by: tuple[str, ...] = ("model",),
    metric: str = "speedup_wall",
    *,
    reference: bool = True,
) -> pl.DataFrame:
    """Per group and target: the ok trial with the highest ranked ``speedup`` among those with
    agreement >= target. With ``reference`` (the default) full depth (``full_depth``) is a candidate at every
    target and wins its ties, so a row names a setting only where it beats full depth; without, null trial columns
    where no trial reaches the target. Settings that rank equal go to the higher measured speedup (the metric
    itself: two ratios inside their noise floors both rank 1.0x), then the higher agreement, then trial_id."""
    keys = list(by)
    ok = ok_trials(trials, metric, ranks=True)
    groups = ok.select(keys).unique()
    if reference:
        ok = pl.concat([ok, full_depth(groups, metric)], how="diagonal_relaxed")
    first = (pl.col("trial_id") == FULL_DEPTH_ID).alias("_reference")
    picks = []
    for target in targets:
        picks.append(
            ok.filter(pl.col("agreement") >= target)
            .with_columns(first)
            .sort(
                [*keys, "speedup", "_reference", metric, "agreement", "trial_id"],
                descending=[False] * len(keys) + [True, True, True, True, False],
            )
            .unique(subset=keys, keep="first", maintain_order=True)
            .drop("_reference")
            .with_columns(target=pl.lit(float(target)))
        )
    grid = groups.join(pl.LazyFrame({"target": [float(t) for t in targets]}), how="cross")
    best = pl.concat(picks, how="vertical_relaxed")
    return grid.join(best, on=[*keys, "target"], how="left").sort([*keys, "target"]).collect()


def params_text(row: dict) -> str:
    """A trial's gate parameters as `key=value` text (the ones it has), then its bench mode,
    draft_len, draft_stop and batch_size where they are not the default."""
    parts = [gate_text(row)] if gate_text(row) else []
    if row.get("mode") == "self_speculative":
        parts += ["mode=self_speculative", f"draft_len={row.get('draft_len')}"]
        if row.get("draft_stop") is not None:
            parts.append(f"draft_stop={row['draft_stop']:g}")
    if (row.get("batch_size") or 1) > 1:
        parts.append(f"batch_size={row['batch_size']}")
    return " ".join(parts)


def _over(expr: pl.Expr, keys: list[str]) -> pl.Expr:
    return expr.over(keys) if keys else expr
