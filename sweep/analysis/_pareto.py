"""Pareto fronts of speedup against agreement, their knees, and the best trial per target.

Every function ranks by the ``speedup`` column of ``ranked`` (the chosen metric, 1.0 for
trials that skipped no compute), so timing noise never wins a front.
"""

from __future__ import annotations

import math

import polars as pl

from sweep.analysis._confidence import ranked
from sweep.analysis._kneedle import kneedle
from sweep.gatespec import gate_text

TARGETS = (0.95, 0.98, 0.99, 1.0)
KNEE_MIN_POINTS = 3  # a knee is a bend: fewer front points have none


def ok_trials(trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall", y: str = "agreement") -> pl.LazyFrame:
    """Rows that count: ``status == ok`` with the metric and agreement present and finite (a NaN
    would rank above every number), with the ranked speedup columns (``ranked``)."""
    ok = trials.lazy().filter((pl.col("status") == "ok") & pl.col(metric).is_finite() & pl.col(y).is_finite())
    return ranked(ok, metric)


def pareto_front(
    trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall", y: str = "agreement", by: tuple[str, ...] = ()
) -> pl.DataFrame:
    """Rows of ``status == ok`` not dominated in (speedup max, y max), per group ``by``;
    ``speedup`` is ``metric`` where the trial skipped compute, else 1.0 (``ranked``)."""
    return nondominated(ok_trials(trials, metric, y), "speedup", y, by)


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


def knees_table(fronts: pl.DataFrame, min_points: int = KNEE_MIN_POINTS) -> pl.DataFrame:
    """One knee row per front (``front``, model, and the gate of a ``model+gate`` front) of at least
    ``min_points`` points, the Kneedle cross-check beside it. ``gate`` and the setting columns are the
    knee trial's own (typed as in ``trials``): join to the fronts on (trial_id, front)."""
    from sweep.store import TABLES

    names = [c.name for c in TABLES["knees"].columns if c.name not in ("schema_version", "created_at")]
    schema = {c.name: c.dtype for c in TABLES["knees"].columns if c.name in names}
    rows = []
    keyed = fronts.with_columns(_front_gate=front_gate())
    for _, front in keyed.partition_by(["front", "model", "_front_gate"], as_dict=True, maintain_order=True).items():
        if front.height < min_points:
            continue
        knee = chord_knees(front.drop("_front_gate"), by=(), min_points=min_points).row(0, named=True)
        cross = kneedle_knee(front)
        row = {name: knee.get(name) for name in names}
        row.update(
            front_points=front.height,
            params=params_text(knee),
            kneedle_trial_id=cross["trial_id"] if cross else None,
            kneedle_speedup=cross["speedup"] if cross else None,
            kneedle_agreement=cross["agreement"] if cross else None,
        )
        rows.append(row)
    return pl.DataFrame(rows, schema=schema).sort("front", "model", "gate")


def front_gate() -> pl.Expr:
    """The gate that names a front: the trial's gate on a ``model+gate`` front, null on a ``model`` front."""
    return pl.when(pl.col("front") == "model+gate").then(pl.col("gate")).otherwise(pl.lit(None, pl.String))


def fronts(trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall") -> pl.DataFrame:
    """Both fronts the report uses, told apart by ``front``: per model across gates (``model``) and
    per (model, gate) (``model+gate``); ``gate`` stays each trial's own."""
    across = pareto_front(trials, metric, by=("model",)).with_columns(front=pl.lit("model"))
    per_gate = pareto_front(trials, metric, by=("model", "gate")).with_columns(front=pl.lit("model+gate"))
    return pl.concat([across, per_gate], how="vertical_relaxed")


def best_at_targets(
    trials: pl.DataFrame | pl.LazyFrame,
    targets: tuple[float, ...] = TARGETS,
    by: tuple[str, ...] = ("model",),
    metric: str = "speedup_wall",
) -> pl.DataFrame:
    """Per group and target: the ok trial with the highest ranked ``speedup`` among those with
    agreement >= target (ties: higher agreement, then trial_id); null trial columns when
    no trial reaches the target."""
    keys = list(by)
    ok = ok_trials(trials, metric)
    picks = []
    for target in targets:
        picks.append(
            ok.filter(pl.col("agreement") >= target)
            .sort([*keys, "speedup", "agreement", "trial_id"], descending=[False] * len(keys) + [True, True, False])
            .unique(subset=keys, keep="first", maintain_order=True)
            .with_columns(target=pl.lit(float(target)))
        )
    groups = ok.select(keys).unique()
    grid = groups.join(pl.LazyFrame({"target": [float(t) for t in targets]}), how="cross")
    best = pl.concat(picks, how="vertical_relaxed")
    return grid.join(best, on=[*keys, "target"], how="left").sort([*keys, "target"]).collect()


def params_text(row: dict) -> str:
    """A trial's gate parameters as `key=value` text (the ones it has), then its bench mode,
    draft_len and batch_size where they are not the default."""
    parts = [gate_text(row)] if gate_text(row) else []
    if row.get("mode") == "self_speculative":
        parts += ["mode=self_speculative", f"draft_len={row.get('draft_len')}"]
    if (row.get("batch_size") or 1) > 1:
        parts.append(f"batch_size={row['batch_size']}")
    return " ".join(parts)


def _over(expr: pl.Expr, keys: list[str]) -> pl.Expr:
    return expr.over(keys) if keys else expr
