"""Bootstrap confidence intervals of agreement and speedup, over a trial's prompts."""

from __future__ import annotations

import numpy as np
import polars as pl

LEVEL = 0.95


def with_confidence(trials: pl.DataFrame, *, n_boot: int = 1000, level: float = LEVEL, seed: int = 0) -> pl.DataFrame:
    """Add agreement_lo/hi, speedup_lo/hi and ci_level from the per-prompt lists.

    Prompts are resampled with replacement ``n_boot`` times (seeded). Agreement is the
    mean of per-prompt agreements (every prompt has the same number of tokens); the
    speedup is sum of baseline ms over sum of gated ms, like the bench's pooled ratio.
    Rows without per-prompt values (older files, failed trials) get nulls.
    """
    rng = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    out: dict[str, list] = {k: [] for k in ("agreement_lo", "agreement_hi", "speedup_lo", "speedup_hi", "ci_level")}
    cols = [trials[c] if c in trials.columns else pl.Series(c, [None] * trials.height) for c in ("prompt_agreement", "prompt_baseline_ms", "prompt_ms")]
    for agree, base, gated in zip(*(c.to_list() for c in cols)):
        if not agree or not base or not gated or len(agree) != len(base) or len(base) != len(gated):
            for values in out.values():
                values.append(None)
            continue
        a, b, g = np.asarray(agree, float), np.asarray(base, float), np.asarray(gated, float)
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        agreement = a[idx].mean(axis=1)
        speedup = b[idx].sum(axis=1) / g[idx].sum(axis=1)
        out["agreement_lo"].append(float(np.quantile(agreement, tail)))
        out["agreement_hi"].append(float(np.quantile(agreement, 1 - tail)))
        out["speedup_lo"].append(float(np.quantile(speedup, tail)))
        out["speedup_hi"].append(float(np.quantile(speedup, 1 - tail)))
        out["ci_level"].append(level)
    return trials.with_columns(pl.Series(k, v, dtype=pl.Float64) for k, v in out.items())
