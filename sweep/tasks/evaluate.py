"""A task's accuracy under the gate and at full depth, on the same problems, in the same trial (``eval.task``).

A trial with ``eval.task`` set measures, after its timed rounds, the task on ``eval.problems`` problems twice: with
the trial's own decoder (early exit under the gate, or self-speculation) and at full depth. Both decode the same
prompts the same way (greedy, or ``eval.samples`` samples at ``eval.temperature`` from the same seeds), so the
difference is the gate's alone. The row gains the task's columns (``TASK_COLUMNS``): the accuracy, the full-depth
accuracy, their difference (``accuracy_loss``, full minus gated: positive is a loss), the per-problem scores (what
the bench bootstraps the intervals from, ``sweep.bench.estimators.task_intervals``: accuracy's over problems,
accuracy_loss's over problems resampled in pairs, each the same estimator as its point) and how the completions'
tokens agree with full depth.

The full-depth side of a task depends on the model, the task's settings and the seed only: a sweep's worker measures
it once and its later trials of that model reuse it (kept in the worker's reuse cache, as the bench's references are;
``task_reference`` says which).

HumanEval (``sweep.tasks.humaneval``): completions are cut at the first stop sequence, run against the problem's
tests in the sandbox (``sweep.tasks.sandbox``); the metric is pass@1 (pass@k for each ``eval.ks`` beside it).
lm-evaluation-harness tasks (``sweep.tasks.harness``): the task's own metric, per document.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Callable, MutableMapping

import numpy as np

from sweep import progress
from sweep.config import Config
from sweep.errors import InputError
from sweep.tasks.completions import Side, cut, sampler, stop_at

log = logging.getLogger("sweep.tasks")

# Chen et al. 2021 (arXiv 2107.03374), section 2.3: a completion ends where a new top-level statement begins
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def reference_key(cfg: Config, lm) -> str:
    """What the full-depth side depends on: the model's weights, dtype and device, the task's settings, the seed."""
    from sweep.config.identity import EVAL_KEYS

    import dataclasses

    key = {
        "model": lm.content_hash,
        "name": lm.name,
        "dtype": str(lm.dtype),
        "device": str(lm.device),
        "seed": cfg.seed,
        "eval": {k: v for k, v in dataclasses.asdict(cfg.eval).items() if k in EVAL_KEYS},
    }
    return json.dumps(key, sort_keys=True)


def check_inputs(cfg: Config) -> None:
    """Before any work (before the model loads): the task's problems can be read, or one line naming them (rc 2),
    instead of an error after the timed rounds that loses the row. HumanEval's data file; each harness task loaded
    as lm-evaluation-harness loads it (its YAML, its dataset's files: ``sweep.tasks.harness.check_tasks``)."""
    if cfg.eval.task == "humaneval":
        from sweep.tasks import humaneval

        try:
            humaneval.problems(1)
        except (OSError, ValueError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise InputError(f"eval.task=humaneval: its problems cannot be read ({first})") from None
    elif cfg.eval.task == "harness":
        from sweep.tasks.harness import check_tasks

        check_tasks(tuple(cfg.eval.harness_tasks or ()), cfg.eval.harness_include)


def evaluate(cfg: Config, lm, engine, memo: MutableMapping | None = None) -> dict[str, Any]:
    """The task's columns of a trial's row, all but the intervals (the bench adds them): ``engine`` (the trial's
    decoder) against full depth. ``memo``: where the full-depth sides are kept between trials (a worker's reuse
    cache, ``sweep.bench.reuse``; None: measured here)."""
    from sweep.decode.engine import Engine

    t0 = time.perf_counter()
    key = reference_key(cfg, lm)
    run = _RUNNERS[cfg.eval.task]
    memo = {} if memo is None else memo
    cached = key in memo
    if not cached:
        while len(memo) >= 4:  # a few tasks' sides, the oldest dropped
            memo.pop(next(iter(memo)))
        memo[key] = run(cfg, lm, Engine(lm), "full depth")
    full = memo[key]
    gated = run(cfg, lm, engine, "gated")
    return task_columns(cfg, lm, gated, full, time.perf_counter() - t0, cached)


def task_columns(cfg: Config, lm, gated: Side, full: Side, seconds: float, cached: bool) -> dict:
    """The row's task columns from both sides (``sweep.store``'s trials table documents each), all but the
    intervals, which the bench adds (``sweep.bench.estimators.task_intervals``)."""
    loss = np.asarray(full.scores) - np.asarray(gated.scores)
    L = lm.num_layers
    exits = gated.exit_layers
    return {
        "task": _task_name(cfg),
        "task_metric": gated.metric,
        "task_problems": len(gated.scores),
        "task_samples": cfg.eval.samples,
        "accuracy": gated.accuracy,
        "accuracy_full": full.accuracy,
        "accuracy_loss": float(loss.mean()) if len(loss) else float("nan"),
        "task_scores": [float(x) for x in gated.scores],
        "task_scores_full": [float(x) for x in full.scores],
        "completions": [c for texts in gated.completions for c in texts] or None,
        "completions_full": [c for texts in full.completions for c in texts] or None,
        "pass_at_k": json.dumps({str(k): v for k, v in sorted(gated.pass_at.items())}) if gated.pass_at else None,
        "pass_at_k_full": json.dumps({str(k): v for k, v in sorted(full.pass_at.items())}) if full.pass_at else None,
        "task_agreement": completion_agreement(gated.tokens, full.tokens) if cfg.eval.samples == 1 else None,
        "task_exit_rate": sum(e < L for e in exits) / len(exits) if exits else None,
        "task_layers_saved": sum(L - e for e in exits) / (L * len(exits)) if exits else None,
        "sandbox": gated.isolation,
        "task_seconds": seconds,
        "task_reference": "cached" if cached else "fresh",
    }


def _task_name(cfg: Config) -> str:
    if cfg.eval.task == "harness":
        return "harness:" + ",".join(cfg.eval.harness_tasks or [])
    return cfg.eval.task


def completion_agreement(gated: list[list[list[int]]], full: list[list[list[int]]]) -> float | None:
    """Greedy only: the fraction of full-depth completion tokens the gated completion has at the same position
    (a shorter gated completion disagrees where it has no token), pooled over problems."""
    same = total = 0
    for g_problem, f_problem in zip(gated, full):
        for g, f in zip(g_problem, f_problem):
            total += len(f)
            same += sum(a == b for a, b in zip(g, f))
    return same / total if total else None


def complete(cfg: Config, lm, engine, prompt: str, stops: tuple[str, ...], seed: int) -> tuple[str, list[int], list]:
    """One completion of ``prompt``: its text cut at the first stop sequence, the token ids it kept, and their exit
    layers (full depth for a decoder that never exits early)."""
    ids = lm.tokenizer(prompt)["input_ids"]
    if not ids:
        raise InputError(f"eval.task={cfg.eval.task}: a prompt tokenizes to nothing")
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    stop = stop_at(lm.tokenizer, stops, eos)
    if cfg.eval.temperature > 0:
        out = engine.generate(ids, cfg.eval.max_tokens, stop=stop, pick=sampler(cfg.eval.temperature, seed))
    else:
        out = engine.generate(ids, cfg.eval.max_tokens, stop=stop)
    tokens = list(out.tokens)
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    text = cut(lm.tokenizer.decode(tokens, skip_special_tokens=True), stops)
    kept = _kept_tokens(lm.tokenizer, tokens, text)
    return text, tokens[:kept], list(out.exit_layers[:kept])


def _kept_tokens(tokenizer, tokens: list[int], text: str) -> int:
    """How many of ``tokens`` the cut text spans (the first prefix whose decoding covers it)."""
    for n in range(len(tokens) + 1):
        if len(tokenizer.decode(tokens[:n], skip_special_tokens=True)) >= len(text):
            return n
    return len(tokens)


def _humaneval(cfg: Config, lm, engine, label: str) -> Side:
    from sweep.tasks import humaneval
    from sweep.tasks.sandbox import Limits

    problems = humaneval.problems(cfg.eval.problems)
    completions, tokens, exits, samples = [], [], [], []
    n = cfg.eval.samples
    with progress.phase(f"humaneval {label}", len(problems) * n, part="eval") as ph:
        for i, problem in enumerate(problems):
            texts, ids = [], []
            for s in range(n):
                text, kept, layers = complete(
                    cfg, lm, engine, problem["prompt"], HUMANEVAL_STOP, cfg.seed + 1000 * i + s
                )
                texts.append(text)
                ids.append(kept)
                exits.extend(layers)
                samples.append((problem["task_id"], text))
                ph.advance()
            completions.append(texts)
            tokens.append(ids)
    limits = Limits(timeout_s=cfg.eval.timeout_s, cpu_s=max(1, math.ceil(cfg.eval.timeout_s)))
    with progress.phase(f"humaneval {label}: tests", None, part="eval"):
        scored = humaneval.score(
            samples, {p["task_id"]: p for p in problems}, limits=limits, workers=cfg.eval.workers, ks=cfg.eval.ks
        )
    return Side(scored.per_problem(1), completions, tokens, exits, scored.pass_at, "pass@1", scored.isolation)


def _harness(cfg: Config, lm, engine, label: str) -> Side:
    from sweep.tasks.harness import run_tasks

    return run_tasks(cfg, lm, engine, label)


_RUNNERS: dict[str, Callable[..., Side]] = {"humaneval": _humaneval, "harness": _harness}
