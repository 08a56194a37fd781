"""Sweep throughput: the README's main job (`make run`), timed end to end, BEFORE and AFTER reuse.

Runs `sweep run experiment=main` (SmolLM2-135M, the saturation grid's 8 trials, 2 prompts x 16
tokens, 2 repeats, one worker) alternately BEFORE (``sweep.reuse=false`` and ``sweep.shared_baseline=1``:
every trial takes its own warm-up, reference runs, determinism self-check and baseline, the old
protocol) and AFTER (one reference and self-check per worker and key, see ``sweep.bench.reuse``, and the
config's ``sweep.shared_baseline``: up to that many settings timed against one baseline per round;
``--shared-after N`` sets it), each into its own
temporary results root, and prints side by side: per trial ``bench_seconds / timed-rounds
seconds`` (timed rounds: the sum of the row's round_* decode and prefill timings, a shared
baseline's counted once per group) with its ``setup_seconds`` (the untimed work before the timed
rounds: cost model, warm-up, self-check; a worker's first group pays it), the sweep's
wall time (process start to exit: Ray start, model load, every trial), their medians and
ratios, and each grid trial's speedup and agreement before and after.

    .venv/bin/python benchmarks/sweep_throughput.py [--pairs 1] [--threads 1] [--keep DIR]

``--shared`` instead compares, in this process, the grid's 8 settings run one trial each (reusing
the reference, as a worker does) with the same 8 settings measured against one shared baseline
per round (``sweep.bench.protocol.run_trials``), alternately: wall time and each setting's speedup.

``--position N`` asks whether a setting's place in a shared group matters: N shared-baseline groups
of the grid's first four settings plus a copy of the first at the far end (baseline, A, B, C, D, A'
forward; A', D, C, B, A, baseline reversed: A always next to the baseline, as in a one-setting
trial, A' always farthest from it), and compares A with A' timed in the same rounds.

``--before-rev REV`` makes BEFORE the code of commit REV itself (a git worktree, run as it was, its own
config's defaults): the protocol before this work began, not this code with reuse turned off (which
shares the cheaper setup of today's code).

``--threads`` sets OMP_NUM_THREADS for the sweeps (the Ray workers inherit it); 1 by default,
as a 2-core machine shared with other work makes 2-thread OpenMP decoding erratic (spin-waits).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / ".venv" / "bin" / "sweep"


def run_sweep(
    root: Path, reuse: bool, threads: int, extra: list[str], shared: int | None = None, code: Path | None = None
) -> float:
    """One `sweep run experiment=main` into ``root``; its wall seconds (process start to exit). ``code``:
    a checkout of an earlier commit to run instead of this one (its own protocol, no overrides of ours)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    # BEFORE: every setting its own baseline and reference; AFTER: the config's default unless --shared-after says
    before = ["sweep.shared_baseline=1", "sweep.reuse=false"] if not reuse else []
    before += [f"sweep.shared_baseline={shared}"] if reuse and shared else []
    if code is not None:  # as it was: its own defaults
        env["PYTHONPATH"] = str(code)  # the driver and its embedded Ray's workers import that checkout
        before = []
    cmd = [str(SWEEP if SWEEP.exists() else "sweep"), "run", "experiment=main", f"results.root={root}", *before, *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=code or ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (root / "sweep.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}); log in {root / 'sweep.log'}:\n{done.stderr[-2000:]}")
    return wall


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def trial_rows(root: Path) -> list[dict]:
    from sweep.store import read

    rows = read("trials", root).to_dicts()
    for row in rows:
        share = row.get("baseline_shared") or 1  # a shared baseline's rounds count once per group
        timed_ms = sum(
            sum(sum(unit) for unit in row[col]) / (share if "baseline" in col else 1)
            for col in ("round_baseline_ms", "round_ms", "round_baseline_prefill_ms", "round_prefill_ms")
        )
        row["timed_seconds"] = timed_ms / 1000
        row["overhead_ratio"] = row["bench_seconds"] / row["timed_seconds"]
        if row.get("setup_seconds") is None:  # a row of a commit before the column (read back as null)
            row["setup_seconds"] = math.nan
        row["own_ratio"] = (row["bench_seconds"] - row["setup_seconds"]) / row["timed_seconds"]
    return sorted(rows, key=lambda r: (r["min_layer"], r["eps"]))


def setting(row: dict) -> str:
    return f"eps={row['eps']:<5} min_layer={row['min_layer']}"


def geo_mean_ratio(one: list[dict], other: list[dict], col: str) -> float:
    """The geometric mean over settings of other / one in ``col``, the rows matched by setting (a
    shared group's settings share one baseline sample, so a pair of runs is one sample, not eight)."""
    mine = {setting(r): r[col] for r in one}
    return math.exp(statistics.fmean(math.log(r[col] / mine[setting(r)]) for r in other))


def main_job_settings(grid: list[tuple[float, float]], threads: int) -> tuple[list, list]:
    """The main job's saturation settings (eps, min_depth), composed and prepared in this process
    (``sweep.bench.protocol.prepare``: the model loaded once), with ``threads`` OpenMP threads."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    from sweep.bench.command import prepare
    from sweep.config import compose

    cfgs = [
        compose(["experiment=main", "gate=saturation", f"gate.eps={eps}", f"gate.min_depth={depth}"])
        for eps, depth in grid
    ]
    return cfgs, [prepare(c) for c in cfgs]


def shared_comparison(pairs: int, threads: int) -> None:
    """One-setting trials (with reuse) against one shared-baseline group, alternately, in-process."""
    from sweep.bench.protocol import run_trials, run_trial
    from sweep.bench.reuse import ReuseCache

    cfgs, prepared = main_job_settings(
        [(eps, depth) for depth in (0.25, 0.5) for eps in (0.05, 0.1, 0.2, 0.3)], threads
    )
    lm, prompts = prepared[0][0], prepared[0][2]
    cache = ReuseCache()
    run_trial(cfgs[0], *prepared[0], references=cache)  # the worker's first trial: reference, warm-up, cost model
    results: dict[str, list] = {"single": [], "shared": []}
    for i in range(pairs):
        for side in ("single", "shared") if i % 2 == 0 else ("shared", "single"):
            t0 = time.perf_counter()
            if side == "single":
                rows = [run_trial(c, *p, references=cache) for c, p in zip(cfgs, prepared)]
            else:
                rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=cache)
            results[side].append((time.perf_counter() - t0, rows))
            print(f"pair {i} {side:<6}: {results[side][-1][0]:7.1f} s", flush=True)
    print(f"\nOMP_NUM_THREADS={threads}; 8 settings one trial each (reuse) vs one shared baseline per round")
    print(f"  wall, median (s): single {statistics.median(w for w, _ in results['single']):.1f}", end="")
    print(f"  shared {statistics.median(w for w, _ in results['shared']):.1f}")
    print("  speedup: median over pairs [min, max]; ratio = shared / single medians")
    print(f"  {'setting':<24}{'speedup single':>22}{'shared':>22}{'ratio':>7}{'agree single':>14}{'shared':>8}")
    ratios = []
    for k in range(len(cfgs)):
        single = [rows[k]["speedup_wall"] for _, rows in results["single"]]
        shared = [rows[k]["speedup_wall"] for _, rows in results["shared"]]
        a, b = statistics.median(single), statistics.median(shared)
        ratios.append(b / a)
        cells = [f"{statistics.median(v):.3f} [{min(v):.3f}, {max(v):.3f}]" for v in (single, shared)]
        agree = [results[side][0][1][k]["agreement"] for side in ("single", "shared")]
        row0 = results["single"][0][1][k]
        print(f"  {setting(row0):<24}{cells[0]:>22}{cells[1]:>22}{b / a:>7.3f}{agree[0]:>14.3f}{agree[1]:>8.3f}")
    print(f"  median ratio shared/single: {statistics.median(ratios):.3f}")
    # where a shift comes from: per pair, shared / single for the speedup, the baseline's ms per token
    # and the gated ms per token
    print("  per pair, geometric mean over settings of shared / single:")
    print(f"  {'pair':<6}{'speedup':>9}{'baseline ms':>13}{'gated ms':>10}")
    for i, ((_, one), (_, grp)) in enumerate(zip(results["single"], results["shared"])):
        cells = [geo_mean_ratio(one, grp, col) for col in ("speedup_wall", "baseline_ms_per_token", "ms_per_token")]
        print(f"  {i:<6}{cells[0]:>9.3f}{cells[1]:>13.3f}{cells[2]:>10.3f}")


def position_check(groups: int, threads: int) -> None:
    """Is a setting's place in a shared group a bias? The same setting next to the baseline (A) and
    farthest from it (A'), timed in the same rounds of each group."""
    from sweep.bench.protocol import run_trials
    from sweep.bench.reuse import ReuseCache

    # A, B, C, D, A' (= A)
    cfgs, prepared = main_job_settings([(0.05, 0.25), (0.1, 0.25), (0.2, 0.25), (0.3, 0.25), (0.05, 0.25)], threads)
    lm, prompts, cache = prepared[0][0], prepared[0][2], ReuseCache()
    # an untimed first group: it carries the worker's warm-up and self-check
    first = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=cache)
    near, far = [], []
    print(f"OMP_NUM_THREADS={threads}; {groups} groups: baseline, A, B, C, D, A' (A = A' = {setting(first[0])})")
    print(f"  {'group':<6}{'A speedup':>10}{'A_ speedup':>11}{'A_/A gated ms':>15}")
    for g in range(1, groups + 1):
        rows = run_trials(cfgs, lm, [p[1] for p in prepared], prompts, references=cache)
        a, b = rows[0], rows[-1]
        assert a["agreement"] == b["agreement"] and a["exit_rate"] == b["exit_rate"]
        near.append(a["speedup_wall"])
        far.append(b["speedup_wall"])
        gated = b["ms_per_token"] / a["ms_per_token"]
        print(f"  {g:<6}{a['speedup_wall']:>10.3f}{b['speedup_wall']:>11.3f}{gated:>15.3f}")
    ratios = [f / n for n, f in zip(near, far)]
    print(
        f"  A'/A speedup: median {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}], "
        f"{sum(r > 1 for r in ratios)} of {len(ratios)} above 1"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1, help="BEFORE/AFTER pairs, alternating which goes first")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the sweeps")
    ap.add_argument("--keep", type=Path, default=None, help="keep the results roots under this directory")
    ap.add_argument("extra", nargs="*", help="more overrides for both sweeps (the same settings on both sides)")
    ap.add_argument("--shared", action="store_true", help="compare one-setting trials with a shared baseline")
    ap.add_argument(
        "--shared-after", type=int, default=None, help="sweep.shared_baseline of the AFTER side (default: the config's)"
    )
    ap.add_argument("--position", type=int, default=0, help="groups of the position check (0: not run)")
    ap.add_argument(
        "--before-rev",
        default=None,
        help="BEFORE runs this git commit's code as it was (a worktree), not this code with reuse turned off",
    )
    args = ap.parse_args()
    if args.position:
        return position_check(args.position, args.threads)
    if args.shared:
        return shared_comparison(args.pairs, args.threads)

    base = (args.keep or Path(tempfile.mkdtemp(prefix="sweep-throughput-"))).resolve()  # absolute: cwd may change
    base.mkdir(parents=True, exist_ok=True)
    code = sha = None
    if args.before_rev:
        sha = git("rev-parse", "--verify", f"{args.before_rev}^{{commit}}")
        code = base / f"code-{sha[:12]}"
        if not code.exists():
            git("worktree", "add", "--detach", str(code), sha)
        print(f"BEFORE: commit {sha[:12]} ({code})", flush=True)
    walls: dict[str, list[float]] = {"before": [], "after": []}
    rows: dict[str, list[list[dict]]] = {"before": [], "after": []}
    try:
        for i in range(args.pairs):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for side in order:
                root = base / f"{side}-{i}"
                after_side = side == "after"
                wall = run_sweep(
                    root, after_side, args.threads, args.extra, args.shared_after, None if after_side else code
                )
                walls[side].append(wall)
                rows[side].append(trial_rows(root))
                if sha and not after_side and any(not str(r["git_sha"]).startswith(sha) for r in rows[side][-1]):
                    sys.exit(f"BEFORE rows in {root} were not written by {sha[:12]}: the worktree's code did not run")
                print(f"pair {i} {side:<6}: {wall:7.1f} s wall, {len(rows[side][-1])} trials ({root})", flush=True)
    finally:
        if code is not None:
            git("worktree", "remove", "--force", str(code))

    print(f"\nOMP_NUM_THREADS={args.threads}; {args.pairs} pair(s); medians over pairs and trials\n")
    for side in ("before", "after"):
        for p, rs in enumerate(rows[side]):
            print(f"{side} (pair {p}): per trial")
            print(
                f"  {'setting':<24}{'bench s':>9}{'setup s':>9}{'timed s':>9}{'ratio':>7}{'trial s':>9}{'speedup':>9}"
                f"{'agree':>7}  reused  reference"
            )
            for r in rs:
                print(
                    f"  {setting(r):<24}{r['bench_seconds']:>9.2f}{r['setup_seconds']:>9.2f}{r['timed_seconds']:>9.2f}"
                    f"{r['overhead_ratio']:>7.2f}"
                    f"{r['trial_seconds']:>9.2f}{r['speedup_wall']:>9.3f}{r['agreement']:>7.3f}  "
                    f"{str(r['reference_reused']):<7} {r['reference_id']}"
                )

    def median(values) -> float:
        values = list(values)
        return statistics.median(values) if values else math.nan

    ratio = {s: median(r["overhead_ratio"] for rs in rows[s] for r in rs) for s in rows}
    # rows that reused their worker's reference: no cost model, warm-up or self-check of their own
    later = {s: median(r["overhead_ratio"] for rs in rows[s] for r in rs if r["reference_reused"]) for s in rows}
    own = {s: median(r["own_ratio"] for rs in rows[s] for r in rs) for s in rows}
    setup = {s: median(sum(r["setup_seconds"] for r in rs) for rs in rows[s]) for s in rows}
    wall = {s: statistics.median(walls[s]) for s in walls}
    trials = {s: statistics.median(sum(r["trial_seconds"] for r in rs) for rs in rows[s]) for s in rows}
    print("\nsummary                                   before     after  after/before")
    print(f"  median bench_seconds / timed seconds  {ratio['before']:>8.2f}  {ratio['after']:>8.2f}")
    print(f"  same, trials that reused a reference  {later['before']:>8.2f}  {later['after']:>8.2f}")
    print(f"  median (bench - setup) / timed        {own['before']:>8.2f}  {own['after']:>8.2f}")
    print(
        f"  sum of setup_seconds (s)              {setup['before']:>8.1f}  {setup['after']:>8.1f}  "
        f"{setup['after'] / setup['before']:>8.2f}"
    )
    print(
        f"  sweep wall time (s)                   {wall['before']:>8.1f}  {wall['after']:>8.1f}  "
        f"{wall['after'] / wall['before']:>8.2f}"
    )
    print(
        f"  sum of trial_seconds (s)              {trials['before']:>8.1f}  {trials['after']:>8.1f}  "
        f"{trials['after'] / trials['before']:>8.2f}"
    )
    print(
        f"  outside trials (Ray, load, driver) (s){wall['before'] - trials['before']:>8.1f}  "
        f"{wall['after'] - trials['after']:>8.1f}"
    )

    print("\ngrid trials, before vs after (last pair)")
    print(f"  {'setting':<24}{'speedup before':>15}{'after':>8}{'agree before':>14}{'after':>8}")
    after = {setting(r): r for r in rows["after"][-1]}
    same_agreement = True
    for r in rows["before"][-1]:
        a = after[setting(r)]
        same_agreement &= r["prompt_agreement"] == a["prompt_agreement"]
        print(
            f"  {setting(r):<24}{r['speedup_wall']:>15.3f}{a['speedup_wall']:>8.3f}"
            f"{r['agreement']:>14.3f}{a['agreement']:>8.3f}"
        )
    print(f"  agreement identical per prompt: {same_agreement}")
    shifts = [geo_mean_ratio(b, a, "speedup_wall") for b, a in zip(rows["before"], rows["after"])]
    print(
        "  per pair, geometric mean over settings of after / before speedup: " + ", ".join(f"{x:.3f}" for x in shifts)
    )


if __name__ == "__main__":
    main()
