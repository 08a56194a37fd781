"""Every registered gate, from one table of cases (tests/helpers/gate_cases.py), on every tiny
family: the engine really exits, the replay on a profile trace decides as the engine does, and
a batch of two decodes each row as the single-sequence engine does (kv_policy=full)."""

from __future__ import annotations

import pytest
from conftest import TINY_FAMILIES
from helpers.gate_cases import CASES
from test_batching import _each_sequence_decides_as_it_would_alone
from test_simulate import N, replay_equals_engine, replays  # noqa: F401 (replays: the traced-model fixture)

from sweep.engine import Engine
from sweep.gates import GATES, make_gate

DTYPE = "float32"
cases = pytest.mark.parametrize("name", sorted(CASES))
families = pytest.mark.parametrize("family", TINY_FAMILIES)


def test_every_registered_gate_has_a_case():
    # the learned exit reads fitted readouts; tests/test_learned_exits.py runs it through the same checks
    assert sorted(CASES) == sorted(set(GATES.names()) - {"classifier"}), "add a case to tests/helpers/gate_cases.py"


def exits_of(lm, gate_cfg, prompts, policy: str) -> list[int]:
    engine = Engine(lm, make_gate(gate_cfg, lm.num_layers), policy)
    return [e for p in prompts for e in engine.generate(p.input_ids, N).exit_layers]


@cases
@families
@pytest.mark.parametrize("policy", ["full", "propagate"])
def test_the_engine_exits(replays, name, family, policy):  # noqa: F811
    case = CASES[name]
    lm, prompts, _, _ = replays(family, DTYPE, converging=case.converging)
    L = lm.num_layers
    exits = exits_of(lm, case.config(family), prompts, policy)
    early = sum(e < L for e in exits)
    assert len(exits) == len(prompts) * N and all(1 <= e <= L for e in exits)
    if not case.exits:
        assert early == 0
        return
    assert early > 0, f"{name} never exits on tiny-{family} ({policy})"
    if case.mixed and policy == "full":
        assert early < len(exits), f"{name} exits at every step on tiny-{family}: its threshold decides nothing"


@cases
@families
def test_the_replay_decides_as_the_engine(replays, name, family):  # noqa: F811
    case = CASES[name]
    lm, prompts, sig, baseline = replays(family, DTYPE, converging=case.converging)
    _, exits, compared = replay_equals_engine(lm, prompts, sig, baseline, case.config(family))
    assert compared >= len(prompts)  # at least each prompt's first token, decided on the traced context
    assert any(e < lm.num_layers for e in exits) == case.exits


@cases
@families
def test_a_batch_of_two_decodes_each_row_as_alone(replays, name, family):  # noqa: F811
    case = CASES[name]
    lm, prompts, _, _ = replays(family, DTYPE, converging=case.converging)
    pair = [list(p.input_ids) for p in prompts[:2]]
    assert len(pair) == 2 and len(pair[0]) != len(pair[1])  # left padding is exercised
    together = _each_sequence_decides_as_it_would_alone(lm, pair, case.config(family), "full")
    assert any(e < lm.num_layers for row in together.exit_layers for e in row) == case.exits
