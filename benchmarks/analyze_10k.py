"""How long does `sweep analyze` take over 10,000 one-row trial files, as sweeps leave them?

    .venv/bin/python benchmarks/analyze_10k.py [--trials 10000] [--pairs 3] [--work DIR]

Builds a results root the way sweeps write one: one real trial (tiny-llama, measured by the
bench in this process) is the template; each of the N rows varies it (model, gate, threshold,
measured timings per round and prompt, per-prompt agreement, status: 2% failed, 1%
nondeterministic) and is written through the sweep driver's own row writer
(``sweep.orchestrate.writer.RowWriter``: one atomic Parquet file per trial). The root is built once under
``--work`` and copied afresh for each pair, so every first run meets the files as a sweep left
them. Then `sweep analyze` runs as a subprocess twice on the copy (first run, second run), with a
fresh reader's cache each pair; the medians over the pairs are printed with the machine's load
average. ``--before DIR`` times an earlier source tree the same way, interleaved with this one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODELS = {"smollm2-135m": 30, "qwen2-0.5b": 24}  # model label -> its layer count L
GATES = ("saturation", "margin", "conformal", "softmax", "cosine", "entropy", "fixed")
SWEEP_SIZE = 500  # trials per sweep: each has one full-depth (gate=full) trial per model
BUILT = ".analyze_10k-built"  # marker: the root under --work is complete for this many trials


def template_row() -> dict:
    """One real trial row: tiny-llama measured by the bench, with its provenance (no file written)."""
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trial
    from sweep.config import compose
    from sweep.store.run_info import new_run_id, provenance

    cfg = compose(["model=tiny-llama", "gate=saturation", "prompts.n=4", "bench.gen_tokens=16"])
    lm, gate, prompts = prepare(cfg)
    row = run_trial(cfg, lm, gate, prompts)
    return {**provenance(cfg, lm, new_run_id()), **row}


def varied(template: dict, i: int, rng: np.random.Generator) -> dict:
    """Trial ``i``: the template with its own setting, timings and per-prompt agreement; the
    headline figures recomputed from them by the bench's own estimators."""
    from sweep.bench.estimators import Timings, mean_agreement

    model = list(MODELS)[i % len(MODELS)]
    L = MODELS[model]
    gate = "full" if i % SWEEP_SIZE < len(MODELS) else GATES[(i // len(MODELS)) % len(GATES)]
    row = dict(template)
    row.update(model=model, num_layers=L, gate=gate, sweep_name=f"grid-{i // SWEEP_SIZE:03d}")
    row.update(worker_pid=1000 + i % 7, worker_model_loads=1, trial_seconds=row["bench_seconds"] + 0.05)
    for key in ("exit_layer", "eps", "theta", "q", "k", "decay"):
        row[key] = None
    min_layer = 1 if gate == "full" else int(rng.integers(1, L))
    row.update(min_layer=min_layer, min_depth=None)
    if gate == "fixed":
        row["exit_layer"] = int(rng.integers(min_layer, L + 1))
    elif gate in ("saturation", "cosine"):
        row["eps"] = float(rng.uniform(0.01, 0.5))
    elif gate in ("margin", "softmax", "entropy"):
        row["theta"] = float(rng.uniform(0.5, 20.0))
    elif gate == "conformal":
        row["q"] = float(rng.uniform(0.5, 1.0))
    key = json.dumps({"model": model, "gate": gate, "setting": i}, sort_keys=True)
    row["trial_id"] = hashlib.sha256(key.encode()).hexdigest()[:16]
    row["trial_key"] = key
    u = rng.random()
    if u < 0.02:
        return {**row, **_null_metrics(row), "status": "failed", "error": "RuntimeError: CUDA out of memory"}
    exit_rate = 0.0 if gate == "full" else float(rng.beta(2, 2))
    kv_full = gate != "full" and rng.random() < 0.1  # bench.kv_policy=full: the skipped layers run anyway
    row["kv_policy"] = "full" if kv_full else "propagate"
    speed = (0.97 if kv_full else 1.0 + exit_rate * (L - min_layer) / L) * float(rng.normal(1.0, 0.05))
    n_prompts, repeats = len(row["prompt_ids"]), len(row["round_ms"])
    base = rng.normal(48.0, 2.0, (repeats, n_prompts)).clip(30)
    gated = base / speed * rng.normal(1.0, 0.03, base.shape)
    prefill = rng.normal(20.0, 1.0, base.shape).clip(5)
    t = Timings(base.tolist(), gated.tolist(), prefill.tolist(), (prefill * 1.02).tolist())
    agree = np.clip(1.0 - exit_rate * rng.uniform(0.0, 0.6, n_prompts), 0, 1).round(4).tolist()
    steps = row["gen_tokens"] - 1
    row.update(
        status="nondeterministic" if u < 0.03 else "ok",
        deterministic=u >= 0.03,
        exit_rate=exit_rate,
        agreement=mean_agreement(agree),
        prefix_agreement=float(np.mean(agree)) * 0.9,
        exact_match=float(np.mean([a == 1.0 for a in agree])),
        layers_saved=exit_rate * (L - min_layer) / L,
        step_layers_saved=exit_rate * (L - min_layer) / L,
        mean_exit_layer=L - exit_rate * (L - min_layer),
        speedup_wall=t.speedup(),
        speedup_e2e_wall=t.speedup_e2e(),
        speedup_model=t.speedup() * float(rng.normal(1.0, 0.04)),
        speedup_e2e_model=t.speedup_e2e() * float(rng.normal(1.0, 0.04)),
        baseline_ms_per_token=float(np.median(base.sum(axis=1))) / (steps * n_prompts),
        ms_per_token=float(np.median(gated.sum(axis=1))) / (steps * n_prompts),
        prompt_agreement=agree,
        prompt_prefix_agreement=[a * 0.9 for a in agree],
        prompt_speedup_wall=np.median(base / gated, axis=0).tolist(),
        prompt_baseline_ms=(np.median(base, axis=0) / steps).tolist(),
        prompt_ms=(np.median(gated, axis=0) / steps).tolist(),
        **t.columns(),
    )
    if row["status"] != "ok":
        row["error"] = "full-depth baselines or timed repeats did not reproduce their tokens"
    return row


def _null_metrics(row: dict) -> dict:
    from sweep.store import PROVENANCE, TABLES

    given = {c.name for c in PROVENANCE} | {"trial_id", "trial_key", "gate", "model"}
    return {c.name: None for c in TABLES["trials"].columns if c.nullable and c.name not in given and c.name in row}


def build(root: Path, n: int) -> float:
    """Write ``n`` trial rows under ``root`` through the sweep driver's row writer; its seconds."""
    from sweep.orchestrate.writer import RowWriter

    template = template_row()
    rng = np.random.default_rng(0)
    writer = RowWriter(str(root), n, [], template["run_id"], "grid", template["device"])
    t0 = time.perf_counter()
    for i in range(n):
        writer.write(varied(template, i, rng))
    return time.perf_counter() - t0


def analyze(root: Path, code: Path, cache: Path) -> float:
    """Seconds of one `sweep analyze` subprocess over ``root`` (it must succeed), running the ``sweep``
    package of the source tree ``code`` with its reader's cache in ``cache``."""
    exe = Path(sys.executable).with_name("sweep")
    env = {**os.environ, "PYTHONPATH": str(code), "SWEEP_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.run([str(exe), "analyze", f"results.root={root}"], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep analyze ({code}) failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=3, help="fresh copies of the root, each analyzed twice")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sweep-analyze-10k"))
    parser.add_argument(
        "--before",
        type=Path,
        help="a source tree of earlier code (git archive REV | tar -x -C DIR), timed the same way, interleaved",
    )
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1]
    sides = {"after": here, **({"before": args.before.resolve()} if args.before else {})}
    pristine = args.work / f"root-{args.trials}"
    marker = pristine / BUILT
    if not marker.is_file():
        shutil.rmtree(pristine, ignore_errors=True)
        seconds = build(pristine, args.trials)
        marker.write_text(f"{args.trials}\n")
        print(f"built {args.trials} trial files in {seconds:.1f} s under {pristine}")
    files = sum(1 for _ in (pristine / "trials").rglob("*.parquet"))
    times: dict[str, dict[str, list[float]]] = {side: {"first": [], "second": []} for side in sides}
    for pair in range(args.pairs):
        order = list(sides) if pair % 2 == 0 else list(reversed(sides))
        for side in order:
            copy, cache = args.work / "copy", args.work / "cache"
            for path in (copy, cache):
                shutil.rmtree(path, ignore_errors=True)
            shutil.copytree(pristine, copy)  # as the sweeps left it: no report, no cache
            for run in ("first", "second"):
                times[side][run].append(analyze(copy, sides[side], cache))
            first, second = times[side]["first"][-1], times[side]["second"][-1]
            print(f"pair {pair + 1} {side}: first {first:.2f} s, second {second:.2f} s", flush=True)
    if not args.pairs:
        return
    load = os.getloadavg()
    loads = " ".join(f"{v:.2f}" for v in load)
    print(f"sweep analyze over {files} trial files, {args.pairs} pairs (load average {loads})")
    for side in sides:
        for run in ("first", "second"):
            values = times[side][run]
            runs = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {side:<6} {run:<6} run: median {statistics.median(values):.2f} s ({runs})")


if __name__ == "__main__":
    main()
