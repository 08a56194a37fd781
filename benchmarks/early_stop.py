"""One grid swept twice, side by side: without stopping, then with `search.min_agreement` (hopeless settings stopped
after their first prompts). Prints each run's wall time, the settings stopped, the decode work each computed,
whether the two fronts above the bar hold the same settings, and, where they do not, whether stopping is why: a
stopped setting on the front without stopping, or a setting measured in both whose agreement differs (agreement
is decided by tokens alone; a speedup near 1x can cross its noise floor from one run to the next).

    .venv/bin/python benchmarks/early_stop.py --root /tmp/st --bar 0.9 -- model=smollm2-135m prompts.n=8 \
        bench.gen_tokens=16 "search.spaces=[...]"

Everything after `--` goes to both `sweep run`s; each writes its own root (`<root>/without`, `<root>/with`). The
order alternates with `--with-first`. Exit code 1 when stopping changed a front: a stopped setting on the front
without stopping, or an agreement that differs between the runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from sweep.analysis import pareto_front
from sweep.store import read

SWEEP = str(Path(sys.executable).with_name("sweep"))


def _run(root: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([SWEEP, "run", f"results.root={root}", *extra], text=True, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"sweep run into {root} failed (rc {done.returncode}): {done.stderr[-2000:]}")
    return seconds


def _work(rows: pl.DataFrame) -> int:
    """Generated tokens the gated runs decoded: prompts x tokens of each row (a stopped row: its first prompts)."""
    return int((rows["n_prompts"] * rows["gen_tokens"]).sum())


def _idle(rows: pl.DataFrame) -> list[float]:
    """Seconds each worker process had no row left to write before the run's last row: how unevenly the bundles
    (Tune trials) ended on the workers, which stopping cannot shorten."""
    end = rows["created_at"].max()
    last = rows.group_by("worker_pid").agg(pl.col("created_at").max())["created_at"]
    return sorted((end - t).total_seconds() for t in last)


def _front(rows: pl.DataFrame, bar: float) -> list[tuple]:
    front = pareto_front(rows, by=("model",)).filter(pl.col("agreement") >= bar)
    return sorted(zip(front["trial_id"], front["agreement"].round(4)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--bar", type=float, default=0.9)
    parser.add_argument("--rung-prompts", type=int, default=2)
    parser.add_argument("--with-first", action="store_true")
    parser.add_argument("sweep_args", nargs="*")
    args = parser.parse_args()
    runs = {
        "without": [],
        "with": [f"search.min_agreement={args.bar}", f"search.rung_prompts={args.rung_prompts}"],
    }
    order = ["with", "without"] if args.with_first else ["without", "with"]
    seconds = {name: _run(args.root / name, [*args.sweep_args, *runs[name]]) for name in order}
    tables = {name: read("trials", args.root / name) for name in order}
    fronts = {}
    for name in order:
        rows = tables[name]
        stopped = rows.filter(pl.col("status") == "stopped")
        fronts[name] = _front(rows, args.bar)
        print(
            f"{name:>7} stopping: {seconds[name]:7.1f} s wall, {rows.height} settings, {stopped.height} stopped "
            f"(at {sorted(stopped['stopped_at_prompts'].to_list())} prompts), {_work(rows)} gated tokens decoded"
        )
        print(f"         workers idle before the last row: {', '.join(f'{s:.1f} s' for s in _idle(rows))}")
        print(f"         front above {args.bar}: {fronts[name]}")
    same = fronts["with"] == fronts["without"]
    print(f"wall time with/without: {seconds['with'] / seconds['without']:.3f}; fronts above the bar identical: {same}")
    return 0 if same else _why_different(tables, fronts)


def _why_different(rows: dict[str, pl.DataFrame], fronts: dict[str, list[tuple]]) -> int:
    """Fronts that differ: stopping's doing (1) or the timing's (0), with the settings that differ."""
    stopped = set(rows["with"].filter(pl.col("status") == "stopped")["trial_id"])
    lost = sorted(tid for tid, _ in fronts["without"] if tid in stopped)
    both = (
        rows["with"]
        .filter(pl.col("status") == "ok")
        .join(rows["without"].filter(pl.col("status") == "ok"), on="trial_id", suffix="_without")
    )
    moved = both.filter(pl.col("agreement") != pl.col("agreement_without"))["trial_id"].to_list()
    differ = sorted(set(fronts["with"]) ^ set(fronts["without"]))
    print(
        f"  on one front only: {differ}; stopped settings on the front without stopping: {lost or 'none'}; "
        f"settings measured in both whose agreement differs: {moved or 'none'}"
    )
    for tid, _ in differ:
        pair = both.filter(pl.col("trial_id") == tid).select("speedup_wall", "speedup_wall_without")
        if pair.height:
            print(f"  {tid}: speedup_wall {pair.item(0, 0):.3f}x with, {pair.item(0, 1):.3f}x without stopping")
    return 1 if lost or moved else 0


if __name__ == "__main__":
    sys.exit(main())
