"""One place for each idea, checked on the sources and on fakes: the engine's stepping interface
is public (nothing outside engine.py touches its private names), model and cache internals are
named only by the adapter, one synchronised timer, and one interleaved timing loop for single
sequences and batches alike."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest
import torch

import sweep

from conftest import compose
from sweep.bench.command import prepare
from sweep.bench.protocol import PhaseEvent, run_trial
from sweep.decode.timing import Timer

SWEEP = Path(sweep.__file__).resolve().parent  # the sweep package


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
    private = private_names(trees.pop("decode/engine.py"))
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "sweep.decode.engine":
                found += [f"{path}: imports {a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.FunctionDef) and node.name in private:
                found.append(f"{path}:{node.lineno}: overrides {node.name}")
    return found


def test_no_module_touches_the_private_names_of_the_engine():
    assert engine_privates_used_outside() == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "decode").mkdir()
    (tmp_path / "decode/engine.py").write_text(
        "class _Exit(Exception): ...\nclass Engine:\n    def _hooks(self): ...\n"
    )
    (tmp_path / "user.py").write_text("from sweep.decode.engine import _Exit\nwith e._hooks() as rope: pass\n")
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


@pytest.mark.parametrize(
    "module", ["models/_kvfill.py", "decode/speculative.py", "decode/batching.py", "decode/engine.py", "bench/costs.py"]
)
def test_model_and_cache_internals_are_named_by_the_adapter_alone(module):
    tree = sources()[module]
    named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    named |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not named & INTERNALS


def test_one_synchronised_timer():
    for path, tree in sources().items():
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        if path != "decode/timing.py":
            assert "torch.cuda.synchronize" not in calls, path
        if path in ("decode/engine.py", "decode/batching.py", "decode/speculative.py", "bench/costs.py"):
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


def tiny_trial(batch_size: int, repeats: int = 2):
    cfg = compose(
        "model=tiny-llama",
        "gate=fixed",
        "gate.exit_layer=2",
        f"bench.batch_size={batch_size}",
        "prompts.n=4",
        "bench.gen_tokens=3",
        f"bench.repeats={repeats}",
        "bench.warmup=1",
    )
    events: list[PhaseEvent] = []
    row = run_trial(cfg, *prepare(cfg), on_event=events.append)
    return row, events


@pytest.mark.parametrize("batch_size", [1, 2])
def test_one_interleaving_for_single_sequences_and_batches(batch_size):
    """Per (round, unit) the baseline, the gated side and the A/A control (a second full-depth run)
    run in turn, reversed when round + unit is odd: the same order whatever a unit is (a prompt, or
    a batch of them), read from the protocol's public events."""
    row, events = tiny_trial(batch_size)
    assert row["status"] == "ok"
    units = 4 // batch_size
    rounds = [(e.round, e.unit, e.side) for e in events if e.phase == "round"]
    expected = []
    for r in range(2):
        for i in range(units):
            order = ["baseline", "gated", "aa"]
            expected += [(r, i, side) for side in (order if (r + i) % 2 == 0 else order[::-1])]
    assert rounds == expected
    assert [e.unit for e in events if e.phase == "reference"] == list(range(units))  # the self-check, per unit


def test_single_and_batched_trials_run_the_same_protocol():
    """Both run the phases in the same order: warm-up, the cost model, the references (their
    self-check), the timed rounds."""
    for batch_size in (1, 2):
        _, events = tiny_trial(batch_size, repeats=1)
        phases = [e.phase for e in events]
        first = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
        assert first == ["warm-up", "cost model", "reference", "round"], (batch_size, first)
        warm = [(e.side, e.unit) for e in events if e.phase == "warm-up"]
        assert warm == [("gated", 0)]  # bench.warmup=1: the self-check's two baselines warm the baseline
