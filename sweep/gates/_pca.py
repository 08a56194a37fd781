"""The decision-relevant subspace probe (the post-mortem's next exploration).

The residual stream may keep moving while the part of it the unembedding reads has
settled. Project final_norm(h_l) on the top-k principal directions of the lm_head weight
(k << vocab) and exit when that projection's relative change from the previous layer falls
below eps. The probe costs a norm and two (k x hidden) products: far less than the lm_head.
"""

from __future__ import annotations

import torch

from sweep.errors import ConfigError
from sweep.gates._gates import Gate
from sweep.gates._registry import register

_BASES: dict[tuple[int, int], torch.Tensor] = {}


def pca_basis(lm_head_weight: torch.Tensor, k: int) -> torch.Tensor:
    """(k, hidden): the top-k principal directions of the unembedding's rows (centred),
    from the eigenvectors of the hidden x hidden covariance; cached per weight and k."""
    key = (id(lm_head_weight), k)
    if key not in _BASES:
        w = lm_head_weight.detach().float()
        w = w - w.mean(dim=0, keepdim=True)
        evals, evecs = torch.linalg.eigh(w.T @ w)
        basis = evecs[:, torch.argsort(evals, descending=True)[:k]].T.contiguous()
        _BASES[key] = basis.to(lm_head_weight.dtype)
    return _BASES[key]


def pca_delta(normed: torch.Tensor, normed_prev: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """||P n_l - P n_{l-1}|| / ||P n_l|| per row (n: final-normed hidden states)."""
    p, q = (normed @ basis.T).float(), (normed_prev @ basis.T).float()
    return (p - q).norm(dim=-1) / p.norm(dim=-1)


@register
class PcaGate(Gate):
    """Exit when the projection of final_norm(h_l) on the lm_head's top-k principal
    directions changes by less than eps from the previous layer."""

    name = "pca"
    params = ("eps", "k")
    probe = "pca"
    threshold = "eps"

    def __init__(self, cfg, num_layers: int) -> None:
        super().__init__(cfg, num_layers)
        if cfg.k is None or cfg.k < 1:
            raise ConfigError(f"gate.k={cfg.k}: must be an integer >= 1 (principal directions of the lm_head)")
        self.basis: torch.Tensor | None = None
        self.norm = None

    @property
    def probe_key(self) -> str:
        return f"pca:{self.cfg.k}"

    def bind(self, adapter) -> None:
        weight = adapter.lm_head.weight
        if self.cfg.k > min(weight.shape):
            raise ConfigError(f"gate.k={self.cfg.k}: must be at most the hidden size {weight.shape[1]}")
        self.basis = pca_basis(weight, self.cfg.k)
        self.norm = adapter.norm

    def decide(self, layer, h, h_prev, z):
        assert self.basis is not None, "pca gate used before bind()"
        return pca_delta(self.norm(h), self.norm(h_prev), self.basis) < self.cfg.eps

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return signals.need("pca_delta")[None] < values[:, None, None]
