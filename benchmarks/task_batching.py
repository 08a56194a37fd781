"""What decoding a task's completions in batches (``eval.batch_size``) buys on this CPU: the same HumanEval prompts
decoded one at a time and in batches of each size, full depth and under a gate, interleaved over repeats (the order
rotates), as generated tokens per second (median over repeats) and the ratio to one at a time measured in the same
run; and whether each batch's tokens equal one-at-a-time decoding's.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/task_batching.py [model=qwen2.5-coder-0.5b] \\
        [--sizes 4,8] [--prompts 8] [--tokens 64] [--repeats 3] [--gate saturation:eps=0.05:min_layer=18]
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

    ap = argparse.ArgumentParser()
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gate", default=None, help="NAME:key=value:... (e.g. saturation:eps=0.05:min_layer=18)")
    args = ap.parse_args()
    cfg = compose(args.overrides or ["model=qwen2.5-coder-0.5b"])
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    sides = {"full depth": None}
    if args.gate:
        name, *kv = args.gate.split(":")
        gcfg = compose([*(args.overrides or ["model=qwen2.5-coder-0.5b"]), f"gate={name}", *(f"gate.{x}" for x in kv)])
        sides[args.gate] = make_gate(gcfg.gate, lm)
    prompts = [lm.tokenizer(p["prompt"])["input_ids"] for p in humaneval.problems(args.prompts)]
    sizes = [int(s) for s in args.sizes.split(",")]
    n = args.tokens
    print(f"{lm.name}: {len(prompts)} HumanEval prompts x {n} tokens, {args.repeats} repeats, sizes 1 and {sizes}")
    for label, gate in sides.items():
        one, batch = Engine(lm, gate, cfg.bench.kv_policy), BatchEngine(lm, gate, cfg.bench.kv_policy)
        singles = [one.generate(p, n).tokens for p in prompts]  # warm-up and the tokens to compare with
        rates: dict[int, list[float]] = {1: [], **{s: [] for s in sizes}}
        same = dict.fromkeys(sizes, True)
        for r in range(args.repeats):
            order = [1, *sizes]
            order = order[r % len(order) :] + order[: r % len(order)]
            for size in order:
                t0 = time.perf_counter()
                if size == 1:
                    for p in prompts:
                        one.generate(p, n)
                else:
                    for start in range(0, len(prompts), size):
                        out = batch.generate_batch(prompts[start : start + size], n)
                        same[size] &= out.tokens == singles[start : start + size]
                rates[size].append(len(prompts) * n / (time.perf_counter() - t0))
        base = statistics.median(rates[1])
        cells = [f"1: {base:.1f} tok/s"]
        for s in sizes:
            med = statistics.median(rates[s])
            cells.append(f"{s}: {med:.1f} tok/s ({med / base:.2f}x, tokens equal: {same[s]})")
        print(f"{label}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
