"""One test case per registered gate: Hydra overrides whose thresholds make the gate really
decide on the tiny random models of tests/conftest.py (2 chat prompts, 8 greedy tokens).

``mixed`` cases exit at some decode steps and run to the last layer at others, on every family
(measured, kv_policy=full); ``fixed`` always exits at its layer and ``full`` never exits. Gemma3's
post-norms make its tiny layers' updates O(1), so its signals sit elsewhere and it has its own
thresholds. The conformal certificate only fires on a model whose logit lens converges, so its
case runs on the converging tiny models of tests/test_simulate.py (``converging``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from sweep.config import GateConfig, compose


@dataclass(frozen=True)
class GateCase:
    overrides: tuple[str, ...]  # gate=NAME and its thresholds
    exits: bool = True  # False: the gate never exits (full)
    mixed: bool = True  # some steps exit, some run to L, on every tiny family
    converging: bool = False  # needs a tiny model whose logit lens converges
    per_family: dict[str, tuple[str, ...]] = field(default_factory=dict)  # overrides that replace the shared ones

    @property
    def name(self) -> str:
        return self.overrides[0].removeprefix("gate=")

    def config(self, family: str) -> GateConfig:
        """The validated gate config of this case on tiny-``family``."""
        return _compose_gate((*self.overrides, *self.per_family.get(family, ())))


@cache
def _compose_gate(overrides: tuple[str, ...]) -> GateConfig:
    return compose(list(overrides)).gate


CASES: dict[str, GateCase] = {
    case.name: case
    for case in (
        GateCase(("gate=full", "gate.min_layer=1"), exits=False, mixed=False),
        GateCase(("gate=fixed", "gate.min_layer=1", "gate.exit_layer=2"), mixed=False),
        GateCase(("gate=saturation", "gate.min_layer=2", "gate.eps=0.6"), per_family={"gemma3": ("gate.eps=0.45",)}),
        GateCase(("gate=margin", "gate.min_layer=1", "gate.theta=1.0"), per_family={"gemma3": ("gate.theta=2.5",)}),
        GateCase(
            ("gate=conformal", "gate.min_layer=1", "gate.q=0.05"),
            converging=True,
            per_family={"gemma3": ("gate.q=0.7",)},
        ),
        GateCase(
            ("gate=softmax", "gate.min_layer=1", "gate.theta=0.1", "gate.decay=4.0"),
            per_family={"gemma3": ("gate.theta=0.6",)},
        ),
        GateCase(("gate=cosine", "gate.min_layer=2", "gate.eps=0.15"), per_family={"gemma3": ("gate.eps=0.1",)}),
        GateCase(("gate=entropy", "gate.min_layer=1", "gate.theta=4.0"), per_family={"gemma3": ("gate.theta=2.0",)}),
        GateCase(("gate=pca", "gate.min_layer=2", "gate.eps=0.6", "gate.k=8")),
    )
}
