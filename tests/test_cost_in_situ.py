"""The cost model measures each gate's probe where the engine pays it: inside real decode steps
(``sweep.bench.costs.cost_model``), with the gate's own decision rule, not a stand-in
measured alone."""

from __future__ import annotations

import copy
import time

import torch

from conftest import load
from sweep.config import GateConfig
from sweep.bench.costs import _ProbeOnly, cost_model, in_situ_key
from sweep.decode.engine import Engine
from sweep.gates import FIRST, Gate, make_gate

PROMPT = list(range(3, 20))


class SlowProbe(Gate):
    """A hidden-state probe whose decision takes 3 ms and never exits."""

    name = "slowprobe"
    probe = "hidden"

    def __init__(self, lm) -> None:
        super().__init__(GateConfig(name="full", min_layer=2), lm.num_layers, adapter=lm.adapter)
        self.seal()

    def decide(self, layer, h, h_prev, z, at=FIRST):
        time.sleep(0.003)
        return torch.zeros(h.shape[0], dtype=torch.bool)


def test_probe_only_steps_decide_after_every_probed_layer_and_never_exit():
    lm = load("model=tiny-llama")
    L = lm.num_layers
    gate = make_gate(GateConfig(name="margin", min_layer=1, theta=0.0), lm)  # exits at its first probe
    engine = Engine(lm, gate, "propagate")
    with torch.inference_mode():
        cache = lm.adapter.new_cache()
        token = lm.adapter.forward(torch.tensor([PROMPT]), cache)[:, -1].argmax(-1, keepdim=True)
        plain_cache = copy.deepcopy(cache)
        with engine.stepping() as stepper:
            gated = stepper.step(token, copy.deepcopy(cache))
        assert gated.exit_layer == 1  # the rule itself exits at once
        with engine.stepping(_ProbeOnly()) as stepper:
            probed = stepper.step(token, cache)
        with Engine(lm).stepping() as stepper:
            plain = stepper.step(token, plain_cache)
    assert probed.exit_layer == L and probed.probes == len(gate.probe_layers()) == L - 1
    torch.testing.assert_close(probed.logits, plain.logits, rtol=0, atol=0)  # a full-depth step, bit for bit


def test_the_probe_charged_is_the_gates_own_decision_in_a_step():
    lm = load("model=tiny-qwen2")
    slow = SlowProbe(lm)
    costs = cost_model(lm, PROMPT, gates=[slow])
    # the gate's own rule (3 ms a decision), not the saturation probe its probe kind measures alone (not
    # measured at all: nothing charges it)
    assert costs.hidden_probe_ms is None
    assert 1.5 <= costs.probe_ms(slow) <= 9.0  # 3 ms, as a fraction of a step measured in other rounds
    assert costs.extra_probe_ms[in_situ_key(slow)] == costs.probe_ms(slow)
    assert slow.min_layer == 2  # measured on a copy: the gate itself is left as it was


def test_gates_reading_one_lens_are_measured_each_with_its_own_rule():
    lm = load("model=tiny-mistral")
    gates = [
        make_gate(GateConfig(name="margin", min_layer=2, theta=1.0), lm),
        make_gate(GateConfig(name="entropy", min_layer=2, theta=1.0), lm),
        make_gate(GateConfig(name="saturation", min_layer=2, eps=0.1), lm),
        make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=2), lm),
    ]
    costs = cost_model(lm, list(range(5, 25)), gates=gates)
    assert {"margin/lens", "entropy/lens", "saturation/hidden"} <= set(costs.extra_probe_ms)
    assert not any(key.startswith("fixed/") for key in costs.extra_probe_ms)  # no probe, nothing measured
    assert costs.probe_ms(gates[3]) == 0.0
    assert "probe margin/lens" in costs.format()


def test_a_model_measured_with_its_gates_times_their_probes_in_its_own_rounds():
    """The first measurement of a model (at a prompt length) times its gates' probes in the same rounds
    as its layers, one plain engine for all; a gate that comes later gets rounds of its own. Both
    charge the gate's own 3 ms decision. The rounds are read from the cost model's progress phases."""
    from sweep import progress

    rounds: list[str] = []

    def timed_rounds(event: progress.Event) -> None:
        if event.kind == "start" and event.phase.startswith(("cost model: step rounds", "cost model: probe ")):
            rounds.append(event.phase)

    lm = load("model=tiny-qwen2")
    slow = SlowProbe(lm)
    with progress.listen(timed_rounds):
        first = cost_model(lm, list(range(3, 32)), gates=[slow, SlowProbe(lm)])  # a length not measured yet
        assert rounds == ["cost model: step rounds, probe slowprobe/hidden"]  # one probe key, measured once
        assert first.probe_ms(slow) >= 1.5  # at least its decision, which sleeps 3 ms
        rounds.clear()
        cost_model(lm, list(range(3, 33)))
        later = cost_model(lm, list(range(3, 33)), gates=[slow])
    assert rounds == ["cost model: step rounds", "cost model: probe slowprobe/hidden"]
    assert later.probe_ms(slow) >= 1.5


class HiddenInRounds(SlowProbe):
    """A 3 ms decision that the timed rounds cannot see, as timing noise hides a cheap probe on a busy
    machine: the copy that decides after every layer in the rounds (``probing_from``) is free."""

    name = "hiddenprobe"

    def probing_from(self, layer):
        other = super().probing_from(layer)
        object.__setattr__(other, "decide", lambda layer, h, h_prev, z, at=FIRST: torch.zeros(h.shape[0], dtype=bool))
        return other


def test_a_probe_the_rounds_cannot_see_is_charged_its_decision_alone_never_nothing():
    """CI saw a saturation probe on the real model priced at 0 layers: the rounds' median said a probed step
    was no dearer than a plain one. A step pays each decision at least once, so the decision timed alone is
    the floor, both when the model is measured with the gate and when the gate comes later."""
    lm = load("model=tiny-qwen2")
    first = cost_model(lm, list(range(3, 27)), gates=[HiddenInRounds(lm)])  # a length not measured yet
    cost_model(lm, list(range(3, 28)))
    later = cost_model(lm, list(range(3, 28)), gates=[HiddenInRounds(lm)])
    for costs in (first, later):
        assert costs.probe_ms(HiddenInRounds(lm)) >= 2.5  # at least the 3 ms sleep, never the free copy's 0
        assert costs.layers(costs.probe_ms(HiddenInRounds(lm))) > 0


class SlowerProbe(SlowProbe):
    name = "slowerprobe"


class SlowerStill(SlowProbe):
    name = "slowerstill"


def test_a_part_that_does_not_fit_its_step_is_measured_again_and_the_parts_after_it_once(monkeypatch):
    """Gates that come after the model's costs, each probe measured in rounds of its own, with a gate's probe held
    to a millionth of a step (GATE_PART) so that no probe can fit: the first gate's probe is measured again (its
    own key named), the costs are unsteady; the second gate's probe is measured once and not blamed on the first
    (before: retried whatever it measured, its line naming the first part)."""
    import logging

    from sweep import progress
    from sweep.bench import costs_cache

    lm = load("model=tiny-qwen2")
    prompt = list(range(3, 41))  # a length no other test measures
    assert cost_model(lm, prompt).source in ("fresh", "cached")
    monkeypatch.setattr(costs_cache, "GATE_PART", 1e-6)
    rounds: list[str] = []
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("sweep.bench.costs_cache")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with progress.listen(lambda e: rounds.append(e.phase) if e.kind == "start" else None):
            costs = cost_model(lm, prompt, gates=[SlowerProbe(lm), SlowerStill(lm)])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert rounds.count("cost model: probe slowerprobe/hidden") == 2, rounds
    assert rounds.count("cost model: probe slowerstill/hidden") == 1, rounds
    again = [m for m in records if "measuring it again" in m]
    assert len(again) == 1 and again[0].startswith("cost model: extra_probe_ms[slowerprobe/hidden]="), records
    assert costs.source == "unsteady"
