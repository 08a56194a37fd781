"""Which speedup a trial is ranked by, and bootstrap confidence intervals of it and of agreement.

The ranked ``speedup`` is ``sweep.bench.estimators.ranked_speedup`` of the measured ratio: a trial that
skipped no compute (no decode step exited, or kv_policy=full ran every skipped layer anyway) is
capped at 1.0 from above (above 1.0 its ratio is timing noise; below, its probes and heads cost
real time and the slowdown stays), and a speedup inside the trial's A/A noise floor is 1.0 (it
cannot be told from full depth). An Optuna objective on speedup_wall is the same function
(``sweep.orchestrate.report``).
Intervals bootstrap the very estimators the bench reports (``sweep.bench.estimators``), ranked the same
way on every resample, seeded per trial.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from sweep.bench.estimators import FLOOR_OF, inside_floor, mean_interval, pooled_speedup, ranked_speedup, skips_compute

LEVEL = 0.95
SPEEDUPS = ("speedup_wall", "speedup_e2e_wall")
FLOORS = FLOOR_OF  # each metric's A/A floor column


_INPUTS = {  # what ranking reads; an older frame's missing ones read as null
    "mode": pl.String,
    "step_layers_saved": pl.Float64,
    "exit_rate": pl.Float64,
    "kv_policy": pl.String,
    **{floor: pl.Float64 for floor in FLOORS.values()},
}


def skipped_compute() -> pl.Expr:
    """True where the trial skipped decoder-layer work on decode steps (``sweep.bench.estimators.skips_compute``:
    self-speculation, or exits on decode steps under a K/V policy other than full)."""

    def skips(s: pl.Series) -> pl.Series:
        f = [s.struct.field(k).to_numpy() for k in ("mode", "step_layers_saved", "exit_rate", "kv_policy")]
        return pl.Series(np.atleast_1d(skips_compute(*f)), dtype=pl.Boolean)

    inputs = pl.struct("mode", "step_layers_saved", "exit_rate", "kv_policy")
    return inputs.map_batches(skips, return_dtype=pl.Boolean, is_elementwise=True)


def ranked(trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall") -> pl.LazyFrame:
    """Add ``speedup_metric``, ``skipped_compute``, ``speedup_floor`` (the metric's A/A noise floor,
    null without one), ``speedup`` (``sweep.bench.estimators.ranked_speedup``), ``capped`` (no compute
    skipped and measured above 1.0: capped to 1.0), ``within_noise`` (the capped ratio lies inside
    the floor: indistinguishable from 1.0; null without a floor) and ``speedup_noise`` (the
    measured ratio of trials that skipped no compute: above 1.0 noise, below 1.0 a real cost)."""
    if metric not in SPEEDUPS:
        raise ValueError(f"speedup metric {metric!r}: one of {', '.join(SPEEDUPS)}")
    frame = trials.lazy()
    names = set(frame.collect_schema().names())
    frame = frame.with_columns(pl.lit(None, t).alias(k) for k, t in _INPUTS.items() if k not in names)
    frame = frame.with_columns(
        speedup_metric=pl.lit(metric),
        skipped_compute=skipped_compute(),
        speedup_floor=pl.col(FLOORS[metric]).cast(pl.Float64),
    )

    def rank(s: pl.Series) -> pl.Series:
        m, f = (s.struct.field(k).cast(pl.Float64).fill_null(np.nan).to_numpy() for k in (metric, "speedup_floor"))
        skipped = s.struct.field("skipped_compute").fill_null(False).to_numpy()
        capped = np.where(skipped, m, np.minimum(m, 1.0))
        within = pl.Series(np.atleast_1d(inside_floor(capped, f)), dtype=pl.Boolean)
        return pl.DataFrame(
            {
                "speedup": pl.Series(np.atleast_1d(ranked_speedup(m, skipped, f)), dtype=pl.Float64).fill_nan(None),
                "capped": pl.Series(~skipped & (m > 1.0), dtype=pl.Boolean),
                "within_noise": within.scatter(np.flatnonzero(np.isnan(f)), None),  # null: no floor applies
            }
        ).to_struct()

    parts = pl.struct(metric, "skipped_compute", "speedup_floor").map_batches(
        rank,
        return_dtype=pl.Struct({"speedup": pl.Float64, "capped": pl.Boolean, "within_noise": pl.Boolean}),
        is_elementwise=True,
    )
    return (
        frame.with_columns(_ranked=parts)
        .with_columns(
            pl.col("_ranked").struct.unnest(),
            speedup_noise=pl.when(pl.col("skipped_compute")).then(None).otherwise(pl.col(metric)),
        )
        .drop("_ranked")
    )


def trial_rng(trial_id: str, seed: int) -> np.random.Generator:
    """The bootstrap's generator for one trial: from the analysis seed and the trial's id only,
    so a trial gets the same interval whatever other rows are analysed with it."""
    digest = hashlib.sha256(f"{seed}:{trial_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def bootstrap_speedup(base: np.ndarray, gated: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """``n_boot`` values of ``pooled_speedup`` on resamples of units (prompts or batches) and
    rounds, both with replacement; ``base``/``gated`` are (rounds, units)."""
    rounds, units = base.shape
    r = rng.integers(0, rounds, size=(n_boot, rounds, 1))
    u = rng.integers(0, units, size=(n_boot, 1, units))
    return pooled_speedup(base[r, u], gated[r, u])


def agreement_interval(
    agree: list[float], trial_id: str, *, seed: int = 0, n_boot: int = 1000, level: float = LEVEL
) -> tuple[float, float]:
    """The bootstrap interval of a trial's agreement from its per-prompt agreement: the one ``with_confidence``
    gives its row (``agreement_lo``, ``agreement_hi``), on whatever prompts it has so far (a sweep's early stop)."""
    return mean_interval(agree, trial_rng(trial_id, seed), n_boot, level)


def with_confidence(
    trials: pl.DataFrame,
    *,
    metric: str = "speedup_wall",
    n_boot: int = 1000,
    level: float = LEVEL,
    seed: int = 0,
    min_prompts: int = 8,
) -> pl.DataFrame:
    """Add the ranked speedup columns (``ranked``) and agreement_lo/hi, speedup_lo/hi,
    ci_level, ci_prompts, ci_units and ci_few_prompts (either interval from fewer than ``min_prompts`` units).

    Agreement: prompts resampled. Speedup (the ranked ``metric``): prompts (batches for
    batched trials) and timed rounds resampled from the round_* timings, the estimator
    applied to each resample and ranked as the point is (``ranked``). Rows without the
    per-prompt or per-round values (failed trials, older files) get nulls there.
    """
    frame = ranked(trials, metric).collect()
    tail = (1.0 - level) / 2.0
    cols = {
        c: frame[c].to_list() if c in frame.columns else [None] * frame.height
        for c in (
            "trial_id",
            "prompt_agreement",
            "round_baseline_ms",
            "round_ms",
            "round_baseline_prefill_ms",
            "round_prefill_ms",
            "skipped_compute",
            "speedup_floor",
        )
    }
    counts = ("ci_prompts", "ci_units")
    out: dict[str, list] = {
        k: [] for k in ("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi", "ci_level", *counts)
    }
    for i in range(frame.height):
        row = {k: v[i] for k, v in cols.items()}
        rng = trial_rng(row["trial_id"] or "", seed)
        agree = row["prompt_agreement"]
        lo = hi = None
        if agree:
            lo, hi = mean_interval(agree, rng, n_boot, level)
        out["agreement_lo"].append(lo)
        out["agreement_hi"].append(hi)
        s_lo, s_hi = _speedup_interval(row, metric, rng, n_boot, tail)
        out["speedup_lo"].append(s_lo)
        out["speedup_hi"].append(s_hi)
        out["ci_level"].append(level if agree or s_lo is not None else None)
        out["ci_prompts"].append(len(agree) if agree else None)
        # the speedup's units: the prompts, or a batched trial's batches (its timings are per batch)
        out["ci_units"].append(len(row["round_ms"][0]) if s_lo is not None else None)
    frame = frame.with_columns(
        *(pl.Series(k, v, dtype=pl.Float64) for k, v in out.items() if k not in counts),
        *(pl.Series(k, out[k], dtype=pl.Int32) for k in counts),
    )
    return frame.with_columns(ci_few_prompts=pl.min_horizontal(*counts) < min_prompts)


def _speedup_interval(row: dict, metric: str, rng: np.random.Generator, n_boot: int, tail: float):
    """The interval of the ranked speedup: the measured estimator on each resample, then ranked as
    the point estimate is (capped where no compute was skipped, 1.0 inside the trial's floor)."""
    base, gated = row["round_baseline_ms"], row["round_ms"]
    if not base or not gated:
        return None, None
    base, gated = np.asarray(base, float), np.asarray(gated, float)
    if metric == "speedup_e2e_wall":
        if not row["round_baseline_prefill_ms"] or not row["round_prefill_ms"]:
            return None, None
        base, gated = (
            base + np.asarray(row["round_baseline_prefill_ms"], float),
            gated + np.asarray(row["round_prefill_ms"], float),
        )
    boot = ranked_speedup(bootstrap_speedup(base, gated, rng, n_boot), row["skipped_compute"], row["speedup_floor"])
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return float(lo), float(hi)
