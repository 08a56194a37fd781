"""One place for each idea, checked on the sources and on fakes: the engine's stepping interface
is public (nothing outside engine.py touches its private names), model and cache internals are
named only by the adapter, one synchronised timer, and one interleaved timing loop for single
sequences and batches alike."""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import compose
from sweep import bench
from sweep.bench import prepare, run_trial
from sweep.timing import Timer

SWEEP = Path(bench.__file__).resolve().parent


def sources(root: Path = SWEEP) -> dict[str, ast.Module]:
    return {str(p.relative_to(root)): ast.parse(p.read_text()) for p in sorted(root.rglob("*.py"))}


def private_names(tree: ast.Module) -> set[str]:
    """Underscore names a module defines: its own functions and classes, and its classes' members."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            names |= {
                t.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Assign)
                for t in n.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            }
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def engine_privates_used_outside(root: Path = SWEEP) -> list[str]:
    trees = sources(root)
    private = private_names(trees.pop("engine.py"))
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "sweep.engine":
                found += [f"{path}: imports {a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.FunctionDef) and node.name in private:
                found.append(f"{path}:{node.lineno}: overrides {node.name}")
    return found


def test_no_module_touches_the_private_names_of_the_engine():
    assert engine_privates_used_outside() == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "engine.py").write_text("class _Exit(Exception): ...\nclass Engine:\n    def _hooks(self): ...\n")
    (tmp_path / "user.py").write_text("from sweep.engine import _Exit\nwith e._hooks() as rope: pass\n")
    assert len(engine_privates_used_outside(tmp_path)) == 2


INTERNALS = {
    "self_attn",
    "k_proj",
    "v_proj",
    "input_layernorm",
    "k_norm",
    "keys",
    "values",
    "crop",
    "is_sliding",
    "is_initialized",
}


@pytest.mark.parametrize("module", ["models/_kvfill.py", "speculative.py", "batching.py", "engine.py", "costs.py"])
def test_model_and_cache_internals_are_named_by_the_adapter_alone(module):
    tree = sources()[module]
    named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    named |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not named & INTERNALS


def test_one_synchronised_timer():
    for path, tree in sources().items():
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if path != "timing.py":
            assert "torch.cuda.synchronize" not in calls, path
        if path in ("engine.py", "batching.py", "speculative.py", "costs.py"):
            assert "time.perf_counter" not in calls, path


def test_the_timer_synchronises_cuda_at_both_ends(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append(str(device)))
    with Timer("cuda:0") as clock:
        assert calls == ["cuda:0"]
    assert calls == ["cuda:0", "cuda:0"] and clock.seconds >= 0
    with Timer("cpu") as clock:
        time.sleep(0.01)
    assert len(calls) == 2 and clock.seconds >= 0.01


@dataclass
class FakeRun:
    tokens: list
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0
    logits: torch.Tensor | None = None

    def rows(self) -> list[FakeRun]:
        return [FakeRun(tokens) for tokens in self.tokens]


class FakeEngine:
    """Records which side ran which unit; a single run's tokens are its prompt's first id and
    its decode seconds the run's place in the call order, so a timing names the run it came from."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def generate(self, ids, n, record=False):
        self.calls.append((self.name, ids[0]))
        return FakeRun(
            [ids[0]] * n, decode_seconds=float(len(self.calls)), logits=torch.zeros(n, 2) if record else None
        )

    def generate_batch(self, prompts, n):
        self.calls.append((self.name, prompts[0][0]))
        return FakeRun([[p[0]] * n for p in prompts], decode_seconds=float(len(self.calls)))


@pytest.mark.parametrize("batched", [False, True])
def test_one_interleaving_for_single_sequences_and_batches(batched):
    """Per (round, unit) the baseline, the gated side and the A/A control (a second full-depth
    run) run in turn, reversed when round + unit is odd: the same order whatever a unit is."""
    from sweep.prompts import Prompt

    calls = []
    size = 2 if batched else 1
    prompts = [Prompt(f"p{i}", "", (i,)) for i in range(2 * size)]
    units = [prompts[i : i + size] for i in range(0, len(prompts), size)]
    base, gated = (bench._Side(FakeEngine(name, calls), 3, batched) for name in ("base", "gated"))
    refs = bench._reference_runs(base, gated, units)
    calls.clear()
    timings, reproduced = bench._timed_rounds(base, gated, refs, repeats=2)
    assert reproduced and len(timings.base_decode) == 2 and len(timings.base_decode[0]) == 2
    first = [unit[0].input_ids[0] for unit in units]
    # every slot runs the unit it times; the gated side always sits between the two full-depth runs
    assert calls == [(side, first[i]) for _ in range(2) for i in range(2) for side in ("base", "gated", "base")]
    for r in range(2):
        for i in range(2):
            slot = 3 * (2 * r + i) + 1  # the call index of this (round, unit)'s first run
            base_at, aa_at = (slot, slot + 2) if (r + i) % 2 == 0 else (slot + 2, slot)
            assert timings.base_decode[r][i] == base_at and timings.aa_decode[r][i] == aa_at, (r, i)
            assert timings.gated_decode[r][i] == slot + 1
    assert [run.prompt for run in refs.prompt_runs(base, gated)] == prompts


def test_single_and_batched_trials_run_the_same_protocol(monkeypatch):
    """run_trial times both paths with ``_timed_rounds`` and checks both with ``_reference_runs``."""
    seen = []
    for name in ("_reference_runs", "_timed_rounds"):
        original = getattr(bench, name)

        def spy(baseline, gated, *args, _name=name, _original=original):
            seen.append((_name, gated.batched))
            return _original(baseline, gated, *args)

        monkeypatch.setattr(bench, name, spy)
    for size in (1, 2):
        cfg = compose(
            "model=tiny-llama",
            "gate=fixed",
            "gate.exit_layer=2",
            f"bench.batch_size={size}",
            "prompts.n=2",
            "bench.gen_tokens=4",
            "bench.repeats=1",
            "bench.warmup=0",
        )
        assert run_trial(cfg, *prepare(cfg))["status"] == "ok"
    assert seen == [
        ("_reference_runs", False),
        ("_timed_rounds", False),
        ("_reference_runs", True),
        ("_timed_rounds", True),
    ]
