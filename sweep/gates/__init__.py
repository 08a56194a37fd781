"""Gates: the torch classes that decide, one per row of the gate-spec table (``sweep.config.gatespec``)."""

from sweep.gates._gates import (
    FIRST,
    ConformalGate,
    Decoding,
    FixedGate,
    FullGate,
    Gate,
    MarginGate,
    SaturationGate,
    SkipGate,
    make_gate,
)
from sweep.gates._calm import CosineGate, EntropyGate, SoftmaxGate
from sweep.gates._pca import PcaGate
from sweep.gates._classifier import ClassifierGate
from sweep.gates._registry import GATES
from sweep.gates._signals import (
    conformal_tau,
    cosine_prev,
    entropy,
    lens_residual,
    lm_head_basis,
    logit_margin,
    pca_basis,
    pca_delta,
    prob_margin,
    saturation_delta,
)


__all__ = [
    "FIRST",
    "Decoding",
    "ClassifierGate",
    "ConformalGate",
    "CosineGate",
    "EntropyGate",
    "PcaGate",
    "SoftmaxGate",
    "conformal_tau",
    "cosine_prev",
    "entropy",
    "lens_residual",
    "lm_head_basis",
    "pca_basis",
    "pca_delta",
    "prob_margin",
    "FixedGate",
    "FullGate",
    "GATES",
    "Gate",
    "MarginGate",
    "SaturationGate",
    "SkipGate",
    "logit_margin",
    "make_gate",
    "saturation_delta",
]
