"""How long does the analysis of one million trial rows take? Prints the median of 3 runs.

    .venv/bin/python benchmarks/analysis_1m.py [ROWS]

Synthetic rows (5 models x 5 gates, speedup and agreement drawn at random, 2% failed):
both Pareto fronts (per model, per model and gate), their knees (chord, Kneedle where a
front has 12+ points) and the best trial at four agreement targets.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import polars as pl

from sweep.analysis import best_at_targets, fronts, knees_table


def synthetic(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    speed = rng.gamma(4.0, 0.3, n)
    agreement = np.clip(1.0 - 0.35 * speed**1.5 + rng.normal(0, 0.08, n), 0, 1)
    return pl.DataFrame(
        {
            "trial_id": [f"{i:016x}" for i in range(n)],
            "model": rng.choice([f"model-{i}" for i in range(5)], n),
            "gate": rng.choice(["fixed", "saturation", "margin", "conformal", "full"], n),
            "status": np.where(rng.random(n) < 0.02, "failed", "ok"),
            "speedup_wall": speed,
            "agreement": agreement,
            "eps": rng.random(n),
            "min_layer": rng.integers(1, 30, n),
            "exit_rate": rng.random(n),
            "step_layers_saved": np.where(rng.random(n) < 0.1, 0.0, rng.random(n)),  # a tenth skipped nothing
            "kv_policy": rng.choice(["propagate", "full"], n, p=[0.9, 0.1]),
            "mode": "early_exit",
        }
    )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    df = synthetic(n)
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        front = fronts(df)
        knees = knees_table(front)
        targets = best_at_targets(df)
        samples.append(time.perf_counter() - t0)
    print(
        f"{n} trial rows: fronts ({front.height} rows), knees ({knees.height} fronts, "
        f"{knees['kneedle_trial_id'].is_not_null().sum()} with a Kneedle cross-check), targets ({targets.height} rows)"
    )
    print(f"median of 3 runs: {statistics.median(samples):.3f} s (runs: {', '.join(f'{s:.3f}' for s in samples)})")


if __name__ == "__main__":
    main()
