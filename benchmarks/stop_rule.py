"""What HumanEval's stop rule costs: `sweep.tasks.completions.stop_at` (the end-of-sequence token, or a stop sequence
anywhere in the decoded text) called once per generated token, as a completion's decode loop calls it, over
completions of 64, 128, 256 and 512 tokens of a HumanEval prompt and its solution; median of 5 per length, beside the
model's full-depth decode step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stop_rule.py [model=smollm2-135m]
"""

from __future__ import annotations

import statistics
import sys
import time

LENGTHS = (64, 128, 256, 512)


def main() -> None:
    from sweep.bench.command import prepare
    from sweep.bench.costs import cost_model
    from sweep.bench.session import process_session
    from sweep.config import compose
    from sweep.tasks import humaneval
    from sweep.tasks.completions import stop_at
    from sweep.tasks.evaluate import HUMANEVAL_STOP

    cfg = compose(sys.argv[1:] or ["model=smollm2-135m"])
    lm, _, prompts = prepare(cfg, process_session())
    problem = humaneval.problems(1)[0]
    ids = lm.tokenizer(problem["prompt"] + problem["canonical_solution"] * 8)["input_ids"]
    stop = stop_at(lm.tokenizer, HUMANEVAL_STOP, None)
    step_ms = cost_model(lm, prompts[0].input_ids).step_ms
    print(f"{lm.name}: full-depth decode step {step_ms:.2f} ms (cost model)")
    for n in LENGTHS:
        seq = ids[:n]
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for k in range(1, len(seq) + 1):
                stop(seq[:k])
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times)
        per = ms / len(seq)
        print(
            f"{len(seq)} tokens: {ms:.1f} ms per completion, {per:.3f} ms per token "
            f"({100 * per / step_ms:.2f}% of a step)"
        )


if __name__ == "__main__":
    main()
