"""Does the lm_head-subspace probe (pca_delta) converge earlier than the raw saturation delta?

Reads the profile traces under RESULTS_ROOT (one model, one run: `sweep profile ...` first),
then prints, side by side:
  1. per layer, the median delta and median pca_delta, and how often pca_delta < delta;
  2. both gates replayed over a fine eps grid (teacher-forced, `sweep.trace.simulate`), compared at
     matched compute: the best agreement among settings whose mean exit layer is at most a target.

    python benchmarks/pca_vs_saturation.py RESULTS_ROOT [--min-layer 8]
"""

from __future__ import annotations

import argparse

import polars as pl

from sweep.config import GateConfig
from sweep.trace.simulate import signals_from_trace, simulate

EPS = [round(0.0025 * i, 4) for i in range(1, 241)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--min-layer", type=int, default=8)
    args = parser.parse_args()
    trace = pl.scan_parquet(f"{args.root}/profile/**/*.parquet").collect()
    curve = (
        trace.group_by("layer")
        .agg(
            delta=pl.col("delta").median(),
            pca_delta=pl.col("pca_delta").median(),
            pca_below=(pl.col("pca_delta") < pl.col("delta")).mean(),
            lens_top1=pl.col("top1_match").mean(),
        )
        .sort("layer")
    )
    positions = trace.select(pl.struct("prompt_id", "position").n_unique()).item()
    print(f"{trace['model'][0]}: {positions} positions, pca_k={trace['pca_k'][0]}")
    print(f"{'layer':>5} {'delta':>8} {'pca_delta':>10} {'pca<delta':>10} {'lens top-1':>11}")
    for r in curve.iter_rows(named=True):
        print(
            f"{r['layer']:>5} {r['delta']:>8.4f} {r['pca_delta']:>10.4f} {r['pca_below']:>10.3f} "
            f"{r['lens_top1']:>11.3f}"
        )

    signals = signals_from_trace(trace)
    frames = []
    for name in ("saturation", "pca"):
        extra = {"k": int(signals.pca_k)} if name == "pca" else {}
        cfgs = [GateConfig(name=name, eps=e, min_layer=args.min_layer, **extra) for e in EPS]
        frames.append(simulate(cfgs, signals, None).with_columns(pl.lit(name).alias("gate")))
    sims = pl.concat(frames, how="diagonal_relaxed")
    L = signals.num_layers
    print(
        f"\nteacher-forced replay on {signals.positions} decision positions, min_layer {args.min_layer}, {len(EPS)} "
        f"eps values per gate"
    )
    print("best agreement among settings with mean exit layer <= target (matched compute):")
    print(f"{'target':>7} {'saturation':>11} {'pca':>8}")
    for target in (L - 0.5, L - 1, L - 1.5, L - 2, L - 3, L - 4, L - 5, L - 6, L - 8, L - 10, L - 14):
        best = dict(
            sims.filter(pl.col("mean_exit_layer") <= target)
            .group_by("gate")
            .agg(pl.col("agreement_tf").max())
            .iter_rows()
        )
        cells = [f"{best[g]:.3f}" if g in best else "-" for g in ("saturation", "pca")]
        print(f"{target:>7g} {cells[0]:>11} {cells[1]:>8}")


if __name__ == "__main__":
    main()
