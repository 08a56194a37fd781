"""K/V propagation for skipped layers in one matmul (kv_policy=propagate).

A token that exits after layer l leaves layers l+1..L without K/V for its position;
CALM fills them from h_l. Per skipped layer j that is RMSNorm_j, K_j and V_j (K norm and
RoPE on K). Since RMSNorm_j(h) = g_j * n(h) with n(h) = h / rms(h) shared by all layers,
K_j(g_j * n) = (K_j diag g_j) n: the projections of every layer are stacked once, with
each layer's norm scale folded in, and a fill is one matmul over the suffix of the stack
that starts at layer l+1. Results equal the layers' own modules up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class StackedKV:
    """Norm-folded K/V projection weights of all layers of one model, stacked by layer."""

    def __init__(self, adapter) -> None:
        cfg = adapter.model.config
        fam = adapter.family
        attn0 = adapter.layers[0].self_attn
        self.head_dim = attn0.head_dim
        self.kv_heads = attn0.k_proj.out_features // self.head_dim
        self.rows = 2 * attn0.k_proj.out_features  # K rows then V rows, per layer
        self.eps = float(cfg.rms_norm_eps)
        self.layer_types = getattr(cfg, "layer_types", None)
        self.k_norm = fam.k_norm
        weights, biases, k_scales = [], [], []
        for layer in adapter.layers:
            attn = layer.self_attn
            scale = layer.input_layernorm.weight.float() + fam.norm_offset
            w = torch.cat([attn.k_proj.weight, attn.v_proj.weight]).float() * scale[None, :]
            weights.append(w.to(attn.k_proj.weight.dtype))
            if attn.k_proj.bias is not None:
                biases.append(torch.cat([attn.k_proj.bias, attn.v_proj.bias]))
            if fam.k_norm:
                k_scales.append(attn.k_norm.weight.float() + fam.norm_offset)
        self.weight = torch.cat(weights)
        self.bias = torch.cat(biases) if biases else None
        self.k_scale = torch.stack(k_scales)[:, None, :] if k_scales else None  # (L, 1, head_dim)

    def fill(self, h: torch.Tensor, cache, start: int, stop: int, rope: dict) -> None:
        """Append K/V of layers start..stop-1 (0-based) for the positions of ``h`` (B, T, hidden)."""
        k, v = self.project(h, start, stop, rope)
        for i, layer in enumerate(range(start, stop)):
            cache.update(k[:, :, i].transpose(1, 2), v[:, :, i].transpose(1, 2), layer)

    def overwrite_last(self, h: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, cache, stop: int, rope: dict) -> None:
        """Replace the last position's K/V of layers starts[i]..stop-1 of batch row rows[i] with
        the projections of h[i] (len(rows), 1, hidden): rows that exited earlier than the batch
        stopped. One matmul over the suffix from the earliest start serves every row."""
        lo = int(starts.min())
        k, v = self.project(h, lo, stop, {key: (c[rows] if c.shape[0] > 1 else c, s[rows] if s.shape[0] > 1 else s) for key, (c, s) in rope.items()})
        for i, layer in enumerate(range(lo, stop)):
            sel = (starts <= layer).nonzero().flatten()
            if len(sel) == 0:
                continue
            entry, target = cache.layers[layer], rows[sel]
            entry.keys[target, :, -1:, :] = k[sel, :, i].transpose(1, 2)
            entry.values[target, :, -1:, :] = v[sel, :, i].transpose(1, 2)

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
