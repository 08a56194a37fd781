"""What the sandbox costs per program: today's `sweep.tasks.sandbox` beside the one at an earlier commit (its
`sandbox.py` and `_jail.py` read from git), in one process, one program at a time, the two alternating (which goes
first swaps every round). Two programs: an empty one, and HumanEval/0's canonical solution with its tests. Prints
the median and the quartiles of the wall time of `run_program` (start to end: launch, the program, cleanup).

    .venv/bin/python benchmarks/sandbox_cost.py [--against 678e34e] [--rounds 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _earlier(commit: str, where: Path):
    """The sandbox module as it was at ``commit``, loaded from files beside its own launcher."""
    for name in ("sandbox.py", "_jail.py"):
        text = subprocess.run(
            ["git", "show", f"{commit}:sweep/tasks/{name}"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        (where / name).write_text(text)
    spec = importlib.util.spec_from_file_location("sandbox_at_" + commit, where / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", default="678e34e")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    from sweep.tasks import sandbox
    from sweep.tasks.humaneval import problems

    problem = problems(1)[0]
    whole = f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\n"
    with tempfile.TemporaryDirectory() as tmp:
        earlier = _earlier(args.against, Path(tmp))
        sides = {
            f"{args.against} (before)": (
                earlier,
                {"empty": "pass\n", "HumanEval/0": whole + f"check({problem['entry_point']})\n"},
            ),
            "now": (sandbox, {"empty": "pass\n", "HumanEval/0": sandbox.Program(whole, problem["entry_point"])}),
        }
        print("now:", sandbox.prepare())
        for module, programs in sides.values():  # warm: the probes, the page cache
            for program in programs.values():
                assert module.run_program(program).passed
        times: dict[tuple[str, str], list[float]] = {(s, p): [] for s in sides for p in ("empty", "HumanEval/0")}
        order = list(sides)
        for r in range(args.rounds):
            for side in order if r % 2 == 0 else order[::-1]:
                module, programs = sides[side]
                for name, program in programs.items():
                    t0 = time.perf_counter()
                    outcome = module.run_program(program)
                    times[(side, name)].append(time.perf_counter() - t0)
                    assert outcome.passed, outcome
    print(f"{args.rounds} rounds, one program at a time, ms per program: median [quartiles]")
    for (side, name), ts in times.items():
        q = statistics.quantiles(ts, n=4)
        print(f"  {side:>18} {name:>12}: {statistics.median(ts) * 1e3:6.1f} [{q[0] * 1e3:.1f}, {q[2] * 1e3:.1f}]")


if __name__ == "__main__":
    sys.exit(main())
