"""The screen's simulated front against its closed-loop trials: how far the replay's figures are from
the measured ones, per trial and per gate."""

from __future__ import annotations

from typing import Any

import polars as pl

from sweep.gates import GATE_COLUMNS


def distinct_simulated(simulated: pl.DataFrame) -> pl.DataFrame:
    """One simulated row per setting (``trial_id``), its newest replay: a root may hold the same setting replayed
    by more than one screen (one that traced afresh under ``sweep.rerun=true``), and each setting counts once."""
    if not simulated.height:
        return simulated
    return simulated.sort("created_at", nulls_last=False).unique(subset="trial_id", keep="last", maintain_order=True)


def comparison(simulated: pl.DataFrame, measured: list[dict[str, Any]]) -> pl.DataFrame:
    """Simulated against measured, per closed-loop trial, and the gap (simulated - measured)."""
    if not measured:
        return pl.DataFrame()
    meas = pl.DataFrame(
        [{k: r.get(k) for k in ("trial_id", "status", "agreement", "speedup_wall")} for r in measured],
        infer_schema_length=None,
    ).filter(pl.col("status") == "ok")
    both = simulated.filter(pl.col("selected")).join(meas, on="trial_id", how="inner")
    return both.select(
        "trial_id",
        "gate",
        "min_layer",
        *GATE_COLUMNS,
        "agreement_tf",
        "agreement",
        (pl.col("agreement_tf") - pl.col("agreement")).alias("agreement_gap"),
        "speedup_model",
        "speedup_wall",
        (pl.col("speedup_model") - pl.col("speedup_wall")).alias("speedup_gap"),
    ).sort("gate", "min_layer", *GATE_COLUMNS, nulls_last=True)


def gap_by_gate(comp: pl.DataFrame) -> pl.DataFrame:
    """Mean and max agreement gap and mean speedup gap per gate (how optimistic the replay is)."""
    return (
        comp.group_by("gate")
        .agg(
            trials=pl.len(),
            agreement_gap_mean=pl.col("agreement_gap").mean(),
            agreement_gap_max=pl.col("agreement_gap").max(),
            speedup_gap_mean=pl.col("speedup_gap").mean(),
        )
        .sort("gate")
    )
