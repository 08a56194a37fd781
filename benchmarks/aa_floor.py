"""The A/A noise floor of this machine: several `sweep bench` runs, each timing full depth against
full depth in the same rounds as its gated run (the A/A control every trial carries), then the
floor per run, pooled over every run's rounds, and the timed rounds a target floor needs.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/aa_floor.py --runs 5 -- \
        model=smollm2-135m gate=full prompts.n=2 bench.gen_tokens=16 bench.repeats=5

Prints the machine's load before and after (`os.getloadavg`): timing figures taken while other
work runs are noisy, and the floor says how noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from sweep.analysis import noise_floors, ok_trials
from sweep.bench.noise import noise_floor, rounds_for_floor
from sweep.store import read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="sweep bench runs, one after another")
    parser.add_argument("--target", type=float, default=0.02, help="the floor to find the rounds for (0.02: +-2%%)")
    parser.add_argument("overrides", nargs="*", help="sweep bench overrides (after --)")
    args = parser.parse_args(argv)
    exe = Path(sys.executable).with_name("sweep")
    root = Path(tempfile.mkdtemp(prefix="aa-floor-"))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for run in range(args.runs):  # a root per run: the same trial's row would replace the last one's
        cmd = [str(exe), "bench", *args.overrides, f"results.root={root / f'run{run}'}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        print(f"run {run + 1}/{args.runs} done; load {os.getloadavg()[0]:.2f}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rows = pl.concat([read("trials", root / f"run{run}") for run in range(args.runs)], how="diagonal_relaxed")
    print("\nrun  speedup_aa  noise_floor  per-round A/A ratios")
    for i, r in enumerate(rows.iter_rows(named=True)):
        ratios = [sum(b) / sum(a) for b, a in zip(r["round_baseline_ms"], r["round_aa_ms"])]
        print(
            f"{i + 1:3d}  {r['speedup_aa']:.4f}      ±{100 * r['noise_floor']:.2f}%      "
            + " ".join(f"{x:.3f}" for x in ratios)
        )
    aa, floors = rows["speedup_aa"].to_list(), rows["noise_floor"].to_list()
    print(
        f"\nspeedup_aa over {len(aa)} runs: median {statistics.median(aa):.4f}, "
        f"least {min(aa):.4f}, greatest {max(aa):.4f}"
    )
    print(
        f"per-run floors: median ±{100 * statistics.median(floors):.2f}%, "
        f"least ±{100 * min(floors):.2f}%, greatest ±{100 * max(floors):.2f}%"
    )
    pooled = noise_floors(ok_trials(rows).collect(), target=args.target).row(0, named=True)
    print(
        f"pooled over {pooled['aa_rounds']} rounds: floor at {pooled['repeats']} rounds "
        f"±{100 * pooled['floor']:.2f}%; rounds for ±{100 * args.target:g}%: {pooled['rounds_for_target']}"
    )
    base = np.concatenate([np.asarray(r, float).sum(axis=1) for r in rows["round_baseline_ms"].to_list()])[:, None]
    other = np.concatenate([np.asarray(r, float).sum(axis=1) for r in rows["round_aa_ms"].to_list()])[:, None]
    for k in (3, 5, 10):
        print(
            f"  pooled floor at {k:3d} rounds: ±{100 * noise_floor(base, other, rounds=k):.2f}%; projected rounds for "
            f"±{100 * args.target:g}%: {rounds_for_floor(base, other, args.target, rounds=k)}"
        )
    logs = np.log(base[:, 0] / other[:, 0])
    offset, mad = float(np.median(logs)), float(np.median(np.abs(logs - np.median(logs))))
    sd = 1.4826 * mad  # robust: a disturbed round does not inflate it
    room = np.log1p(args.target) - abs(offset)
    closed = (1.959964 * np.sqrt(np.pi / 2) * sd / room) ** 2 if room > 0 else float("inf")
    print(
        f"closed form (normal per-round log-ratios, robust sd {sd:.4f} = 1.4826 MAD, median offset {offset:+.4f}): "
        f"rounds for ±{100 * args.target:g}% ~ (1.96 sqrt(pi/2) sd / (log(1 + target) - |offset|))^2 = {closed:.0f}"
    )
    print(f"rows: {root}/run*/trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
