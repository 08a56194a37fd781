"""Prompt categories (a JSONL prompt's "category"; HumanEval is code, the built-in set chat) on every row, and the
report's speedup and acceptance per category, as Spec-Bench reports them."""

from __future__ import annotations

import json
import math

import pytest

from conftest import compose, run_cli

BENCH = ("bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0")


def _jsonl(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "m1", "prompt": "What is two plus two?", "category": "math"},
        {"id": "p1", "prompt": "Write a short poem about rain.", "category": "poem"},
        {"id": "m2", "prompt": "What is seven times six?", "category": "math"},
        {"id": "x", "prompt": "Say hello."},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_rows_carry_each_prompts_category_and_the_report_gives_them(tmp_path):
    from sweep.bench.command import run_bench

    root = tmp_path / "results"
    path = _jsonl(tmp_path)
    common = ("model=tiny-llama", "prompts=jsonl", f"prompts.path={path}", *BENCH, f"results.root={root}")
    spec = run_bench(compose(*common, "gate=fixed", "gate.exit_layer=2", "bench.mode=self_speculative"))[1]
    assert spec["prompt_categories"] == ["math", "poem", "math", "jsonl"]  # no category: the set's own name
    assert len(spec["prompt_acceptance"]) == 4
    chat = run_bench(compose("model=tiny-llama", "prompts.n=2", "gate=full", *BENCH, f"results.root={root}"))[1]
    assert chat["prompt_categories"] == ["chat", "chat"]
    # the fastest setting of all, at an agreement far under the verdicts' 0.98: not the best setting there
    fast = run_bench(compose("model=tiny-llama", "prompts.n=2", "gate=fixed", "gate.exit_layer=1", *BENCH,
                             f"results.root={root}"))[1]  # fmt: skip
    assert fast["agreement"] < 0.98
    done = run_cli("analyze", f"results.root={root}")
    assert done.returncode == 0, done.stderr
    report = (root / "report" / "report.md").read_text()
    section = report.split("## Per prompt category")[1].split("\n## ")[0]
    math_idx = [0, 2]
    geo = math.exp(sum(math.log(spec["prompt_speedup_wall"][i]) for i in math_idx) / 2)
    accept = sum(spec["prompt_acceptance"][i] for i in math_idx) / 2
    assert f"| math | 2 | {geo:.3f}x | {accept:.2f} |" in section
    chat_lines = [line for line in section.splitlines() if "| chat | 2 |" in line]
    assert "| poem | 1 |" in section and len(chat_lines) == 1 and "| best setting: full " in chat_lines[0]
    assert "exit_layer=1 " not in section and "best draft: fixed exit_layer=2 min_layer=1 mode=self_spec" in section


@pytest.mark.parametrize("category", [3, "", "x" * 65])
def test_a_bad_category_is_one_line_naming_the_line(tmp_path, category):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "hi"})
        + "\n"
        + json.dumps({"id": "b", "prompt": "yo", "category": category})
        + "\n"
    )
    done = run_cli(
        "bench", "model=tiny-llama", "prompts=jsonl", f"prompts.path={path}", f"results.root={tmp_path / 'r'}"
    )
    assert done.returncode == 2 and f"prompts.path={path} line 2" in done.stderr and '"category"' in done.stderr
