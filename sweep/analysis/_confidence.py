"""Which speedup a trial is ranked by, and bootstrap confidence intervals of it and of agreement.

A trial that skipped no compute (no decode step exited, or kv_policy=full ran every skipped
layer anyway) cannot be faster than full depth: its ranked ``speedup`` is 1.0 by
construction and its measured ratio is kept as ``speedup_noise``. Intervals bootstrap the
very estimators the bench reports (``sweep.estimators``), seeded per trial.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from sweep.estimators import mean_agreement, pooled_speedup

LEVEL = 0.95
SPEEDUPS = ("speedup_wall", "speedup_e2e_wall")


def skipped_compute() -> pl.Expr:
    """True where the trial skipped decoder-layer work on decode steps: self-speculation
    (drafts run fewer layers), or early exit with exits on decode steps under a K/V policy
    that does not run the skipped layers anyway."""
    speculative = pl.col("mode").fill_null("early_exit") == "self_speculative"
    # step_layers_saved: layers the (batch's) decode steps skipped; older rows fall back to exits
    saved = pl.coalesce(pl.col("step_layers_saved"), pl.col("exit_rate")).fill_null(0.0) > 0
    return speculative | (saved & (pl.col("kv_policy") != "full"))


def ranked(trials: pl.DataFrame | pl.LazyFrame, metric: str = "speedup_wall") -> pl.LazyFrame:
    """Add ``speedup_metric``, ``skipped_compute``, ``speedup`` (``metric``, 1.0 where no
    compute was skipped) and ``speedup_noise`` (the measured ratio of those trials)."""
    if metric not in SPEEDUPS:
        raise ValueError(f"speedup metric {metric!r}: one of {', '.join(SPEEDUPS)}")
    skipped = skipped_compute()
    return trials.lazy().with_columns(
        speedup_metric=pl.lit(metric),
        skipped_compute=skipped,
        speedup=pl.when(skipped).then(pl.col(metric)).otherwise(pl.lit(1.0)),
        speedup_noise=pl.when(skipped).then(None).otherwise(pl.col(metric)),
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


def bootstrap_agreement(per_prompt: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """``n_boot`` values of ``mean_agreement`` on resamples of prompts, with replacement."""
    idx = rng.integers(0, len(per_prompt), size=(n_boot, len(per_prompt)))
    return mean_agreement(per_prompt[idx])


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
    ci_level, ci_prompts and ci_few_prompts.

    Agreement: prompts resampled. Speedup (the ranked ``metric``): prompts (batches for
    batched trials) and timed rounds resampled from the round_* timings, the estimator
    applied to each resample; 1.0-1.0 for trials that skipped no compute. Rows without the
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
        )
    }
    out: dict[str, list] = {
        k: [] for k in ("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi", "ci_level", "ci_prompts")
    }
    for i in range(frame.height):
        row = {k: v[i] for k, v in cols.items()}
        rng = trial_rng(row["trial_id"] or "", seed)
        agree = row["prompt_agreement"]
        lo = hi = None
        if agree:
            boot = bootstrap_agreement(np.asarray(agree, float), rng, n_boot)
            lo, hi = (float(v) for v in np.quantile(boot, [tail, 1 - tail]))
        out["agreement_lo"].append(lo)
        out["agreement_hi"].append(hi)
        s_lo, s_hi = _speedup_interval(row, metric, rng, n_boot, tail)
        out["speedup_lo"].append(s_lo)
        out["speedup_hi"].append(s_hi)
        out["ci_level"].append(level if agree or s_lo is not None else None)
        out["ci_prompts"].append(len(agree) if agree else None)
    frame = frame.with_columns(
        *(pl.Series(k, v, dtype=pl.Float64) for k, v in out.items() if k != "ci_prompts"),
        pl.Series("ci_prompts", out["ci_prompts"], dtype=pl.Int32),
    )
    return frame.with_columns(ci_few_prompts=pl.col("ci_prompts") < min_prompts)


def _speedup_interval(row: dict, metric: str, rng: np.random.Generator, n_boot: int, tail: float):
    if not row["skipped_compute"]:
        return 1.0, 1.0
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
    lo, hi = np.quantile(bootstrap_speedup(base, gated, rng, n_boot), [tail, 1 - tail])
    return float(lo), float(hi)
