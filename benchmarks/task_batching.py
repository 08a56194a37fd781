"""What decoding a task's completions in batches (``eval.batch_size``) buys on this CPU: the first N HumanEval
problems completed as an evaluation completes them (greedy, cut at HumanEval's stop sequences, at most
``--max-tokens``), one at a time and in batches of each size (ended rows leave the batch), full depth and optionally
under a gate, interleaved over repeats (the order rotates). It prints each way's seconds for the N problems (median
over repeats), the ratio to one at a time measured in the same run, and whether the completions equal one-at-a-time
decoding's.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/task_batching.py [model=qwen2.5-coder-0.5b] \\
        [--sizes 4,8] [--problems 16] [--max-tokens 128] [--repeats 2] [--gate fixed:exit_layer=22]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    from sweep.config import compose
    from sweep.decode.batching import BatchEngine
    from sweep.decode.engine import Engine
    from sweep.gates import make_gate
    from sweep.models import load_model
    from sweep.tasks import humaneval
    from sweep.tasks.evaluate import HUMANEVAL_STOP, complete, complete_batch

    ap = argparse.ArgumentParser()
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gate", default=None, help="NAME:key=value:... (e.g. fixed:exit_layer=22)")
    args = ap.parse_args()
    base = args.overrides or ["model=qwen2.5-coder-0.5b"]
    cfg = compose([*base, f"eval.max_tokens={args.max_tokens}"])  # decoding only: no program runs here
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    sides = {"full depth": None}
    if args.gate:
        name, *kv = args.gate.split(":")
        sides[args.gate] = make_gate(compose([*base, f"gate={name}", *(f"gate.{x}" for x in kv)]).gate, lm)
    prompts = [p["prompt"] for p in humaneval.problems(args.problems)]
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"{lm.name}: the first {len(prompts)} HumanEval problems, at most {args.max_tokens} tokens each, "
        f"{args.repeats} repeats, one at a time and in batches of {sizes}"
    )
    for label, gate in sides.items():
        one, batch = Engine(lm, gate, cfg.bench.kv_policy), BatchEngine(lm, gate, cfg.bench.kv_policy)
        alone = [complete(cfg, lm, one, p, HUMANEVAL_STOP, 0) for p in prompts]  # warm-up, and what to compare
        tokens = sum(len(kept) for _, kept, _ in alone)
        seconds: dict[int, list[float]] = {1: [], **{s: [] for s in sizes}}
        same = dict.fromkeys(sizes, True)
        for r in range(args.repeats):
            order = [1, *sizes]
            order = order[r % len(order) :] + order[: r % len(order)]
            for size in order:
                t0 = time.perf_counter()
                if size == 1:
                    for p in prompts:
                        complete(cfg, lm, one, p, HUMANEVAL_STOP, 0)
                else:
                    for start in range(0, len(prompts), size):
                        got = complete_batch(cfg, lm, batch, prompts[start : start + size], HUMANEVAL_STOP)
                        same[size] &= got == alone[start : start + size]
                seconds[size].append(time.perf_counter() - t0)
        single = statistics.median(seconds[1])
        cells = [f"one at a time {single:.1f} s ({tokens / single:.2f} completion tokens/s)"]
        for s in sizes:
            med = statistics.median(seconds[s])
            cells.append(f"batches of {s} {med:.1f} s ({single / med:.2f}x, completions equal: {same[s]})")
        print(f"{label}: {tokens} completion tokens; " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
