"""Gates: exit rules in one registry, each with its signal, decision and probe kind."""

from sweep.gates._gates import (
    ConformalGate,
    FixedGate,
    FullGate,
    Gate,
    MarginGate,
    SaturationGate,
    logit_margin,
    make_gate,
    saturation_delta,
)
from sweep.gates._registry import GATES, Registry


__all__ = [
    "ConformalGate",
    "FixedGate",
    "FullGate",
    "GATES",
    "Gate",
    "MarginGate",
    "Registry",
    "SaturationGate",
    "logit_margin",
    "make_gate",
    "saturation_delta",
]
