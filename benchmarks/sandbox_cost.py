"""What the sandbox costs per program, and what a program beside it in a batch is left: today's `sweep.tasks`
beside the one at an earlier commit (its `sweep/` exported from git), each side in a process of its own, the two
alternating (which goes first swaps every round).

- cost: one program at a time, an empty one and HumanEval/0's canonical solution with its tests; the median and
  quartiles of the wall time of `run_program` (launch, the program, cleanup);
- `--neighbour`: a quick program (about a third of a second of CPU) alone, then in one batch beside a program that
  spins in 60 processes, each in a session of its own; the quick program's wall time both ways.

    .venv/bin/python benchmarks/sandbox_cost.py [--against 678e34e] [--rounds 40] [--neighbour]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the side's worker: one line in (what to run), one JSON line out (seconds, and whether each passed)
WORKER = r"""
import json, sys, time
from sweep.tasks import sandbox
from sweep.tasks.humaneval import problems

problem = problems(1)[0]
whole = f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\n"
checked = sandbox.Program(whole, problem["entry_point"]) if hasattr(sandbox, "Program") else whole
QUICK = "t = 0\nfor i in range(3_000_000):\n    t += i\nprint(t)\n"
SPIN = "import os\nfor _ in range(60):\n    if os.fork() == 0:\n        os.setsid()\n        while True:\n"
SPIN += "            pass\nwhile True:\n    pass\n"
SHARE = sandbox.Limits(timeout_s=6.0, cpu_s=60, processes=64)
print(json.dumps(sandbox.prepare()), flush=True)
for line in sys.stdin:
    what = line.strip()
    t0 = time.perf_counter()
    if what == "beside":
        out = sandbox.run_programs([SPIN, QUICK], SHARE, workers=2)[1:]
    else:
        out = [sandbox.run_program({"empty": "pass\n", "HumanEval/0": checked, "alone": QUICK}[what], SHARE)]
    seconds = out[0].seconds if what in ("beside", "alone") else time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "passed": all(o.passed for o in out)}), flush=True)
"""


def _export(commit: str, where: Path) -> Path:
    """``commit``'s `sweep/` package, as files under ``where``."""
    data = subprocess.run(["git", "archive", commit, "sweep"], cwd=REPO, capture_output=True, check=True).stdout
    tar = where / "sweep.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as t:
        t.extractall(where, filter="data")
    return where


class Side:
    def __init__(self, path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/"
        )
        self.isolation = json.loads(self.proc.stdout.readline())

    def run(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", default="678e34e")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--neighbour", action="store_true")
    args = parser.parse_args()
    programs = ("alone", "beside") if args.neighbour else ("empty", "HumanEval/0")
    with tempfile.TemporaryDirectory() as tmp:
        sides = {f"{args.against} (before)": Side(_export(args.against, Path(tmp))), "now": Side(REPO)}
        for name, side in sides.items():
            print(f"{name}: {side.isolation}")
            for what in programs:  # warm: the probes, the page cache
                side.run(what)
        times: dict[tuple[str, str], list[float]] = {(s, p): [] for s in sides for p in programs}
        order = list(sides)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                for what in programs:
                    got = sides[name].run(what)
                    assert got["passed"] or args.neighbour, (name, what, got)
                    times[(name, what)].append(got["seconds"] if got["passed"] else float("inf"))
        for side in sides.values():
            side.close()
    print(f"{args.rounds} rounds, ms per program: median [quartiles] (inf: it did not pass in its time)")
    for (side, name), ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else (ts[0], ts[0], ts[0])
        print(f"  {side:>18} {name:>12}: {statistics.median(ts) * 1e3:6.1f} [{q[0] * 1e3:.1f}, {q[2] * 1e3:.1f}]")


if __name__ == "__main__":
    sys.exit(main())
