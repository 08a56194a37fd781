"""Is the bench's full-depth decode loop as fast as a bare forward-with-cache loop, and
faster than model.generate()? Prints medians (ms/token) and ratios measured side by side.

    .venv/bin/python benchmarks/decode_loop.py [hydra overrides, e.g. dtype=float16]
"""

from __future__ import annotations

import statistics
import sys

import torch

from sweep.config import compose
from sweep.decode.engine import Engine
from sweep.models import load_model
from sweep.models.prompts import read_prompts, tokenize_prompts
from sweep.decode.timing import Timer


def bare_loop(lm, ids: list[int], n: int) -> float:
    """The model's own forward with a DynamicCache, greedy, nothing else; decode seconds (synchronised on GPU)."""
    model = lm.model
    with torch.inference_mode():
        cache = lm.adapter.new_cache()
        out = model(input_ids=torch.tensor([ids], device=lm.device), cache=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        with Timer(lm.device) as decode:
            for _ in range(n - 1):
                out = model(input_ids=token, cache=cache, use_cache=True)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
        return decode.seconds


def generate(lm, ids: list[int], n: int) -> float:
    """model.generate() greedy: seconds for n tokens minus seconds for 1 token (its prefill),
    so it is charged for the same n - 1 decode steps as the loops."""

    def timed(tokens: int) -> float:
        with torch.inference_mode():
            x = torch.tensor([ids], device=lm.device)
            with Timer(lm.device) as t:
                lm.model.generate(x, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return t.seconds

    return timed(n) - timed(1)


def compare(lm, prompts, n: int, rounds: int = 5) -> dict[str, float]:
    """Median ms/token of the bench's loop, the bare forward loop and model.generate() over
    ``rounds`` x prompts, interleaved (the order reversed every other round), after one warm-up each."""
    engine = Engine(lm)
    sides = {
        "bench loop": lambda ids: engine.generate(ids, n).decode_seconds / (n - 1),
        "bare forward loop": lambda ids: bare_loop(lm, ids, n) / (n - 1),
        "model.generate()": lambda ids: generate(lm, ids, n) / (n - 1),
    }
    for p in prompts:  # warm-up
        for fn in sides.values():
            fn(list(p.input_ids))
    samples: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for p in prompts:
            for name in order:
                samples[name].append(sides[name](list(p.input_ids)) * 1000)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    cfg = compose(["prompts.n=2", *sys.argv[1:]])
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    prompts = tokenize_prompts(read_prompts(cfg.prompts), cfg.prompts, lm.tokenizer)
    n, rounds = cfg.bench.gen_tokens, 5
    med = compare(lm, prompts, n, rounds)
    print(f"{lm.name} {cfg.dtype} on {lm.device}: {len(prompts)} prompts x {n} tokens x {rounds} rounds, interleaved")
    for name, value in med.items():
        print(f"  {name:<20} {value:8.2f} ms/token (median)")
    print(f"  bench loop / bare forward loop = {med['bench loop'] / med['bare forward loop']:.3f}")
    print(f"  bench loop / model.generate()  = {med['bench loop'] / med['model.generate()']:.3f}")


if __name__ == "__main__":
    main()
