"""One session object owns what a process keeps between trials (``sweep.bench.session``); gates are complete
when built (``make_gate(cfg, lm, readouts)``) and immutable for a run, per-token state living in the decoder's
step state (``Decoding``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from conftest import compose, load
from sweep.bench.session import Session, process_session
from sweep.config import GateConfig
from sweep.decode.engine import Engine
from sweep.gates import make_gate

N = 6
PROMPT = list(range(3, 15))
SWEEP = Path(__file__).resolve().parents[1] / "sweep"


def test_a_gate_is_immutable_and_a_run_leaves_it_as_built():
    lm = load("model=tiny-llama")
    gate = make_gate(GateConfig(name="softmax", min_layer=1, theta=0.2, decay=4.0), lm)
    before = dict(vars(gate))
    with pytest.raises(AttributeError, match="immutable"):
        gate.min_layer = 2
    engine = Engine(lm, gate, "propagate")
    first = engine.generate(PROMPT, N)
    second = engine.generate(PROMPT, N)
    assert first.tokens == second.tokens and first.exit_layers == second.exit_layers
    assert vars(gate) == before  # no per-token state written into the gate
    assert any(e < lm.num_layers for e in first.exit_layers)  # the gate exits: the decaying rule ran


def test_conformal_keeps_its_calibration_out_of_the_gate():
    """Two prompts in turn under one conformal gate decide as each does alone: tau is the prompt's, in the
    step state, not left in the gate by the prompt before."""
    lm = load("model=tiny-qwen2")
    gate = make_gate(GateConfig(name="conformal", min_layer=1, q=0.5), lm)
    other = list(range(40, 70))
    together = Engine(lm, gate, "full")
    pair = [together.generate(ids, N).exit_layers for ids in (other, PROMPT)]
    alone = Engine(lm, make_gate(GateConfig(name="conformal", min_layer=1, q=0.5), lm), "full").generate(PROMPT, N)
    assert pair[1] == alone.exit_layers
    assert not hasattr(gate, "tau")


def test_an_engine_refuses_a_gate_built_without_its_model_or_for_another():
    lm, other = load("model=tiny-llama"), load("model=tiny-qwen2")
    cfg = GateConfig(name="margin", min_layer=1, theta=1.0)
    with pytest.raises(ValueError, match="built without a model"):
        Engine(lm, make_gate(cfg, lm.num_layers))
    with pytest.raises(ValueError, match="for another model"):
        Engine(lm, make_gate(cfg, other))
    Engine(lm, make_gate(GateConfig(name="full"), lm.num_layers))  # full depth reads nothing of the model


def test_a_gate_that_reads_readouts_is_refused_without_them():
    lm = load("model=tiny-llama")
    with pytest.raises(ValueError, match="without the fitted readouts"):
        make_gate(GateConfig(name="margin", min_layer=1, theta=1.0, lens="tuned", readouts="x"), lm)


def test_the_cost_models_probed_copy_leaves_the_gate_as_built():
    from sweep.bench.costs import cost_model

    lm = load("model=tiny-mistral", "seed=5")
    gate = make_gate(GateConfig(name="margin", min_layer=3, theta=1.0), lm)
    cost_model(lm, list(range(4, 20)), gates=[gate], repeats=2)
    assert gate.min_layer == 3 and list(gate.probe_layers()) == list(range(3, lm.num_layers))


def test_a_session_owns_models_readouts_and_references():
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trial

    cfg = compose("model=tiny-llama", "seed=41", "gate=fixed", "gate.exit_layer=2", "prompts.n=1", "bench.gen_tokens=4")
    a, b = Session(), Session()
    lm_a, gate_a, prompts = prepare(cfg, a)
    assert prepare(cfg, a)[0] is lm_a and prepare(cfg, b)[0] is not lm_a  # each session its own models
    first = run_trial(cfg, lm_a, gate_a, prompts, a.reference_source(cfg))
    again = run_trial(cfg, lm_a, gate_a, prompts, a.reference_source(cfg))
    assert first["reference_source"] == again["reference_source"] == "cached"
    assert again["reference_reused"] and again["reference_id"] == first["reference_id"]
    assert b.references.peek(next(iter(a.references.references))) is None  # nothing shared between sessions
    assert process_session() is process_session()


def test_no_module_keeps_a_trials_cache_of_its_own():
    """What a process keeps between trials lives in the session: no other module starts an empty dict,
    list or set to fill later, but the few named here that are no trial's."""
    written = []
    for path in sorted(SWEEP.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, (ast.Dict, ast.List, ast.Set))
            and not (node.value.elts if isinstance(node.value, (ast.List, ast.Set)) else node.value.keys)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        written += [f"{path.relative_to(SWEEP.parent)}:{name}" for name in sorted(names)]
    # empty containers at module level are state filled later. What trials keep is the session's; the others
    # are no trial's: which stop signals arrived (per process by nature), and the store readers' memo of the
    # files already checked and of the schemas parsed (keyed by file stat and by schema text)
    assert written == [
        "sweep/bench/session.py:_PROCESS",
        "sweep/orchestrate/interrupt.py:_active",
        "sweep/orchestrate/interrupt.py:_received",
        "sweep/store/_guard.py:_SCHEMAS",
        "sweep/store/_guard.py:_verdicts",
    ], written


def test_decoding_state_is_the_steps_not_the_gates():
    """CALM's decaying threshold follows the token being decided (``Decoding``), with the same gate."""
    from sweep.gates import Decoding

    gate = make_gate(GateConfig(name="softmax", min_layer=1, theta=0.5, decay=4.0), 4)
    z = torch.tensor([[2.0, 0.8, 0.0]])  # p_top1 - p_top2 = 0.486
    early, late = gate.decide(2, z, z, z, Decoding(0, 10)), gate.decide(2, z, z, z, Decoding(9, 10))
    # 0.9 * 0.5 + 0.1 * exp(-4 t / 10): 0.55 at the first token, 0.4527 at the tenth
    assert bool(late) and not bool(early)


@pytest.mark.parametrize("command", ["profile", "bench", "fit", "calibrate"])
def test_every_verb_refuses_bad_input_in_prepare_and_writes_nothing(command, tmp_path):
    """The command layer (``sweep.cli.verbs``): prepare -> run -> write -> render. A prompts file that
    cannot be read fails in prepare, before any model loads, and nothing is written under the root."""
    from sweep.cli.verbs import VERBS
    from sweep.errors import SweepError
    from sweep.models import model_loads

    bad = tmp_path / "prompts.jsonl"
    bad.write_text("{not json\n")
    root = tmp_path / "root"
    gate = ["gate=saturation", "calibrate.grid='range(0.1, 0.3, step=0.1)'"] if command == "calibrate" else []
    cfg = compose("model=tiny-llama", "prompts=jsonl", f"prompts.path={bad}", f"results.root={root}", *gate)
    loads = model_loads()
    with pytest.raises(SweepError, match="prompts"):
        VERBS[command].execute(cfg, Session())
    assert model_loads() == loads and not root.exists()


def test_a_verbs_steps_run_in_order_and_render_what_was_written(tmp_path):
    from sweep.cli.verbs import VERBS

    cfg = compose(
        "model=tiny-llama",
        "gate=saturation",
        "gate.eps=0.3",
        "prompts.n=1",
        "bench.gen_tokens=3",
        f"results.root={tmp_path}",
    )
    lines, code, (path, row) = VERBS["bench"].execute(cfg, Session())
    assert code == 0 and Path(path).is_file() and lines[-1] == f"row: {path}"
    assert row["status"] == "ok" and row["trial_id"] in path
    lines, code, report = VERBS["analyze"].execute(compose(f"results.root={tmp_path}"))
    assert code == 0 and report.is_file() and lines[-1] == f"report: {report}"
    assert any(line.startswith("tiny-llama") or "tiny-llama" in line for line in lines[:-1])  # a verdict per model
