"""Every gate signal, defined once.

The engine's gates (``decide``), the profile trace (``sweep profile``) and the replay of a
trace (``sweep.trace.simulate``) all compute a signal with the function here, never with a
formula of their own: a replayed decision is the closed-loop one whatever the model's
dtype. Every function reads its inputs in float32 (a bf16/fp16 model's h_l and z_l are
upcast before any arithmetic) and returns float32, one value per row.

A decision compares a signal with a level (the threshold, CALM's decayed threshold, or
2 tau_l): ``below``, ``at_least`` and ``at_most`` do it on both paths, with the level computed
in float64 (``level_tensor``) and rounded once to float32.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def saturation_delta(h: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
    """||h_l - h_{l-1}||_2 / ||h_l||_2 per row (the difference taken in float32)."""
    h32 = h.float()
    return (h32 - h_prev.float()).norm(dim=-1) / h32.norm(dim=-1)


def cosine_prev(h: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
    """cos(h_l, h_{l-1}) per row."""
    return F.cosine_similarity(h.float(), h_prev.float(), dim=-1)


def logit_margin(z: torch.Tensor) -> torch.Tensor:
    """gamma: top1 - top2 of the logits, per row."""
    top2 = z.float().topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def prob_margin(z: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 softmax probability, per row (CALM's softmax response)."""
    top2 = F.softmax(z.float(), dim=-1).topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) in nats, per row."""
    logp = F.log_softmax(z.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def pca_basis(lm_head_weight: torch.Tensor, k: int) -> torch.Tensor:
    """(k, hidden): the top-k principal directions of the unembedding's rows (centred), from
    the eigenvectors of the hidden x hidden covariance, in the weight's dtype. Not cached:
    ``lm_head_basis`` keeps it with the loaded model."""
    w = lm_head_weight.detach().float()
    w = w - w.mean(dim=0, keepdim=True)
    evals, evecs = torch.linalg.eigh(w.T @ w)
    basis = evecs[:, torch.argsort(evals, descending=True)[:k]].T.contiguous()
    return basis.to(lm_head_weight.dtype)


def lm_head_basis(adapter, k: int) -> torch.Tensor:
    """``pca_basis`` of this model's lm_head, computed once per loaded model (kept on its adapter)."""
    return adapter.derived(("pca_basis", k), lambda: pca_basis(adapter.lm_head.weight, k))


def pca_delta(normed: torch.Tensor, normed_prev: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """||P n_l - P n_{l-1}|| / ||P n_l|| per row (n: final-normed hidden states, P: ``basis``)."""
    b = basis.float()
    p, q = normed.float() @ b.T, normed_prev.float() @ b.T
    return (p - q).norm(dim=-1) / p.norm(dim=-1)


def lens_residual(z: torch.Tensor, z_final: torch.Tensor) -> torch.Tensor:
    """The lens's sup-norm residual ||z_l - z_L||_inf per row."""
    return (z.float() - z_final.float()).abs().amax(dim=-1)


def conformal_tau(residual: torch.Tensor, q) -> torch.Tensor:
    """tau: the q-quantile (linear interpolation) of ``residual`` (..., positions) over its last
    dimension, NaN entries (padding) left out; ``q`` a number (result (...)) or a 1-D tensor
    of K (result (K, ...))."""
    r = residual.float().cpu()
    qs = torch.as_tensor(q, dtype=torch.float64).reshape(-1).to(torch.float32)
    tau = torch.nanquantile(r, qs, dim=-1)
    return tau[0] if torch.as_tensor(q).dim() == 0 else tau


def level_tensor(value) -> torch.Tensor:
    """A threshold (number or tensor) as a float64 tensor: levels are computed in float64."""
    return torch.as_tensor(value, dtype=torch.float64)


def _level32(level, device) -> float | torch.Tensor:
    """``level`` rounded to float32, the signals' precision: a Python float for a number or a
    0-dim tensor (exactly representable in float32, so any comparison with a float32 signal is
    exact; no tensor to copy to the device in the engine's hot path), else a float32 tensor."""
    if isinstance(level, torch.Tensor):
        if level.dim() == 0:
            return float(level.to(torch.float32))
        return level.to(torch.float32).to(device)
    return float(np.float32(level))


def below(signal: torch.Tensor, level) -> torch.Tensor:
    """signal < level, with the level rounded to float32 (the engine's and the replay's rule alike)."""
    return signal.float() < _level32(level, signal.device)


def at_least(signal: torch.Tensor, level) -> torch.Tensor:
    """signal >= level, with the level rounded to float32."""
    return signal.float() >= _level32(level, signal.device)


def at_most(signal: torch.Tensor, level) -> torch.Tensor:
    """signal <= level, with the level rounded to float32."""
    return signal.float() <= _level32(level, signal.device)


def decayed(threshold, token_index, gen_tokens: int, tau: float | None) -> torch.Tensor:
    """CALM's decaying threshold (Schuster et al. 2022): clip(0.9 * threshold + 0.1 * exp(-tau * t / N), 0, 1)
    for the t-th of N generated tokens; the threshold itself when tau is None. Numbers or
    tensors (broadcast), computed in float64 for the engine and the replay alike."""
    threshold = level_tensor(threshold)
    if tau is None:
        return threshold
    t = level_tensor(token_index)
    return (0.9 * threshold + 0.1 * torch.exp(-tau * t / gen_tokens)).clamp(0.0, 1.0)
