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
from sweep.gates._calm import CosineGate, EntropyGate, SoftmaxGate, cosine_prev, entropy, prob_margin
from sweep.gates._pca import PcaGate, pca_basis, pca_delta
from sweep.gates._registry import GATES, Registry


__all__ = [
    "ConformalGate",
    "CosineGate",
    "EntropyGate",
    "PcaGate",
    "SoftmaxGate",
    "cosine_prev",
    "entropy",
    "pca_basis",
    "pca_delta",
    "prob_margin",
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
