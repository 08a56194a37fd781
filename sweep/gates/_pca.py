"""The decision-relevant subspace probe (the post-mortem's next exploration).

The residual stream may keep moving while the part of it the unembedding reads has
settled. Project final_norm(h_l) on the top-k principal directions of the lm_head weight
(k << vocab) and exit when that projection's relative change from the previous layer falls
below eps. The probe costs a norm and two (k x hidden) products: far less than the lm_head.
"""

from __future__ import annotations

from sweep.gates.base import FIRST, Gate
from sweep.gates.spec import GateSpec, check_model, lazy, register

torch = lazy("torch")
sig = lazy("sweep.gates.signals")  # every signal, once (torch: imported when a gate decides)


@register(
    GateSpec(
        "pca",
        "exits when final_norm(h_l)'s projection on the lm_head's top-k directions changes < eps",
        probe="pca",
        signal="pca_delta",
        params=("eps", "k"),
        threshold="eps",
    )
)
class PcaGate(Gate):
    """Exit when the projection of final_norm(h_l) on the lm_head's top-k principal
    directions changes by less than eps from the previous layer."""

    def __init__(self, cfg, num_layers: int, hidden_size: int | None = None, **parts) -> None:
        super().__init__(cfg, num_layers, hidden_size, **parts)
        self.basis = self.norm = None
        if self.adapter is not None:
            check_model(cfg, num_layers, hidden_size=self.adapter.lm_head.weight.shape[1])
            self.basis = sig.lm_head_basis(self.adapter, cfg.k)  # kept with the model, computed once
            self.norm = self.adapter.norm

    @property
    def probe_key(self) -> str:
        return f"pca:{self.cfg.k}"

    def decide(self, layer, h, h_prev, z, at=FIRST):
        if self.basis is None:
            raise RuntimeError("gate=pca built without a model reads no hidden state (make_gate(cfg, lm))")
        return sig.below(sig.pca_delta(self.norm(h), self.norm(h_prev), self.basis), self.cfg.eps)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.below(signals.need("pca_delta")[None], sig.level_tensor(values)[:, None, None])
