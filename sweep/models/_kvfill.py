"""K/V propagation for skipped layers in one matmul (kv_policy=propagate).

A token that exits after layer l leaves layers l+1..L without K/V for its position;
CALM fills them from h_l. Per skipped layer j that is RMSNorm_j, K_j and V_j (K norm and
RoPE on K). Since RMSNorm_j(h) = g_j * n(h) with n(h) = h / rms(h) shared by all layers,
K_j(g_j * n) = (K_j diag g_j) n: the projections of every layer are stacked once, with
each layer's norm scale folded in, and a fill is one matmul over the suffix of the stack
that starts at layer l+1. Results equal the layers' own modules up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LayerKV:
    """The modules of one decoder layer that a K/V fill recomputes, as the adapter resolved
    them from the family table: the input RMSNorm, the K and V projections, the K norm (if any)."""

    norm: torch.nn.Module
    key: torch.nn.Linear
    value: torch.nn.Linear
    key_norm: torch.nn.Module | None


class StackedKV:
    """Norm-folded K/V projection weights of all layers of one model, stacked by layer.

    Pure arithmetic on the modules it is handed (``LayerKV`` per layer, the head size, the
    RMSNorm epsilon and offset, each layer's RoPE type): it never looks a part up by name and
    never touches a cache; the adapter writes what ``project`` returns.
    """

    def __init__(
        self, layers: list[LayerKV], *, head_dim: int, eps: float, norm_offset: float, layer_types: list[str] | None
    ) -> None:
        first = layers[0].key
        self.head_dim = head_dim
        self.kv_heads = first.out_features // head_dim
        self.rows = 2 * first.out_features  # K rows then V rows, per layer
        self.eps = eps
        self.layer_types = layer_types
        weights, biases, k_scales = [], [], []
        for part in layers:
            scale = part.norm.weight.float() + norm_offset
            w = torch.cat([part.key.weight, part.value.weight]).float() * scale[None, :]
            weights.append(w.to(part.key.weight.dtype))
            if part.key.bias is not None:
                biases.append(torch.cat([part.key.bias, part.value.bias]))
            if part.key_norm is not None:
                k_scales.append(part.key_norm.weight.float() + norm_offset)
        self.weight = torch.cat(weights)
        self.bias = torch.cat(biases) if biases else None
        self.k_scale = torch.stack(k_scales)[:, None, :] if k_scales else None  # (L, 1, head_dim)

    def project_rows(self, h: torch.Tensor, rows: torch.Tensor, start: int, stop: int, rope: dict):
        """``project`` for some rows of a batch: ``h`` (len(rows), T, hidden) and the batch's
        RoPE narrowed to ``rows`` (a RoPE shared by every row is kept as it is)."""

        def narrow(t: torch.Tensor) -> torch.Tensor:
            return t[rows] if t.shape[0] > 1 else t

        return self.project(h, start, stop, {key: (narrow(c), narrow(s)) for key, (c, s) in rope.items()})

    def project(self, h: torch.Tensor, start: int, stop: int, rope: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """K (with K norm and RoPE) and V of layers start..stop-1 for ``h``: (B, T, J, kv_heads, head_dim) each."""
        B, T, _ = h.shape
        J = stop - start
        x = h.float()
        n = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(h.dtype)
        rows = slice(start * self.rows, stop * self.rows)
        kv = F.linear(n, self.weight[rows], None if self.bias is None else self.bias[rows])
        kv = kv.view(B, T, J, 2, self.kv_heads, self.head_dim)
        k, v = kv[:, :, :, 0], kv[:, :, :, 1]  # (B, T, J, kv_heads, head_dim)
        if self.k_scale is not None:
            kf = k.float()
            k = (kf * torch.rsqrt(kf.pow(2).mean(-1, keepdim=True) + self.eps) * self.k_scale[start:stop]).to(h.dtype)
        cos, sin = self._rope(rope, start, stop)
        return k * cos + _rotate_half(k) * sin, v

    def _rope(self, rope: dict, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) broadcastable to (B, T, J, kv_heads, head_dim)."""
        if None in rope:
            cos, sin = rope[None]
            return cos[:, :, None, None, :], sin[:, :, None, None, :]
        types = [self.layer_types[j] for j in range(start, stop)]
        cos = torch.stack([rope[t][0] for t in types], dim=2)[:, :, :, None, :]
        sin = torch.stack([rope[t][1] for t in types], dim=2)[:, :, :, None, :]
        return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
