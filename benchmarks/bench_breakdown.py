"""Where a bench's time goes, at two sizes: `sweep bench` run as a user runs it, small and large
alternating, its closing time breakdown parsed (``sweep.progress.Breakdown``), medians per part and the
large/small ratio of each. No part should grow faster than the timed rounds.

    OMP_NUM_THREADS=1 python benchmarks/bench_breakdown.py --pairs 2 \\
        --small prompts.n=2 bench.gen_tokens=16 --large prompts.n=4 bench.gen_tokens=32 \\
        -- model=smollm2-135m gate=saturation gate.eps=0.2 gate.min_layer=8
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PART = re.compile(r"(?:^|, )([a-zA-Z][a-zA-Z /-]*?) (\d+(?:\.\d+)?)(s|min)")


def breakdown(line: str) -> dict[str, float]:
    """Seconds per part of a `time 12s: load 3.2s, cost model 0.5s, ..., other 1.1s` line; "total" too."""
    head, _, parts = line.partition(": ")
    total = re.match(r"time (\d+(?:\.\d+)?)(s|min)", head)
    if total is None:
        raise ValueError(f"not a breakdown line: {line!r}")
    out = {"total": float(total.group(1)) * (60 if total.group(2) == "min" else 1)}
    for name, value, unit in PART.findall(parts):
        out[name] = float(value) * (60 if unit == "min" else 1)
    return out


def bench(args: list[str], root: Path) -> dict[str, float]:
    exe = Path(sys.executable).with_name("sweep")
    res = subprocess.run(
        [str(exe), "--quiet", "bench", *args, f"results.root={root}"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise SystemExit(f"sweep bench {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    # the breakdown is the last line, wrapped to 120 columns: join its continuation lines
    lines = res.stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("time "))
    return breakdown(" ".join(line.strip() for line in lines[start:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--small", nargs="+", required=True)
    p.add_argument("--large", nargs="+", required=True)
    p.add_argument("common", nargs="*", help="overrides of both sizes (after --)")
    a = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"small": [], "large": []}
    with tempfile.TemporaryDirectory() as root:
        for pair in range(a.pairs):
            order = ("small", "large") if pair % 2 == 0 else ("large", "small")
            for size in order:
                runs[size].append(bench([*a.common, *(a.small if size == "small" else a.large)], Path(root)))
                print(f"pair {pair + 1} {size}: {runs[size][-1]}", flush=True)
    parts = [k for k in runs["small"][0] if k != "total"] + ["total"]
    med = {size: {k: statistics.median(r.get(k, 0.0) for r in rs) for k in parts} for size, rs in runs.items()}
    print(f"{'part':<24}{'small (s)':>11}{'large (s)':>11}{'large/small':>13}")
    for k in parts:
        ratio = med["large"][k] / med["small"][k] if med["small"][k] > 0 else float("nan")
        print(f"{k:<24}{med['small'][k]:>11.2f}{med['large'][k]:>11.2f}{ratio:>13.2f}")
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
