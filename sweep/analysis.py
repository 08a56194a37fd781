"""Analysis of trial rows with polars: Pareto fronts of speedup against agreement."""

from __future__ import annotations

import polars as pl


def pareto_front(
    trials: pl.DataFrame | pl.LazyFrame, x: str = "speedup_wall", y: str = "agreement", by: tuple[str, ...] = ()
) -> pl.DataFrame:
    """Rows of ``status == ok`` not dominated in (x max, y max), per group ``by``.

    A row is dominated when another has x and y at least as large and one of them
    strictly larger; rows tied on both are all kept. Sorted by group, then x descending.
    A row survives iff its y is the largest among rows with its x, and larger than
    every y among rows with a larger x.
    """
    keys = list(by)
    ok = trials.lazy().filter((pl.col("status") == "ok") & pl.col(x).is_not_null() & pl.col(y).is_not_null())
    per_x = (
        ok.group_by([*keys, x])
        .agg(_y_at_x=pl.col(y).max())
        .sort([*keys, x], descending=[False] * len(keys) + [True])
        .with_columns(_y_beyond=_over(pl.col("_y_at_x").cum_max().shift(1), keys))
    )
    front = ok.join(per_x, on=[*keys, x], how="inner", nulls_equal=True).filter(
        (pl.col(y) == pl.col("_y_at_x")) & (pl.col("_y_beyond").is_null() | (pl.col(y) > pl.col("_y_beyond")))
    )
    return front.drop("_y_at_x", "_y_beyond").sort([*keys, x], descending=[False] * len(keys) + [True]).collect()


def _over(expr: pl.Expr, keys: list[str]) -> pl.Expr:
    return expr.over(keys) if keys else expr
