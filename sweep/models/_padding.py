"""A left-padded batch as the model's own forward takes it: every prompt whole, right-aligned to the
longest, with an attention mask (0 on padding) and each row's own position ids (0 at its first real
token), so masks, positions and any cache see each row as they would see it alone. Whether a model's
forward really decodes such a batch as each row alone is checked at load (``sweep.models._fidelity``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Padded:
    """A left-padded batch: ``ids`` and ``mask`` (B, longest), ``positions`` (B, longest) each
    row's own position ids (0 at its first real token; 0 on padding), ``lengths`` (B,) the
    prompts' own lengths. ``mask`` is None when every prompt has the same length (nothing to mask)."""

    ids: torch.Tensor
    mask: torch.Tensor | None
    positions: torch.Tensor
    lengths: torch.Tensor


PAD_ID = 0  # any valid id: padded positions are masked out of every real position's attention


def left_pad(prompts: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> Padded:
    """Each prompt whole, right-aligned to the longest one."""
    lengths = torch.tensor([len(p) for p in prompts])
    if int(lengths.min()) < 1:
        raise ValueError("left_pad: empty prompt")
    n = int(lengths.max())
    pads = n - lengths
    ids = torch.tensor([[PAD_ID] * int(pad) + list(p) for p, pad in zip(prompts, pads)], device=device)
    real = torch.arange(n)[None, :] >= pads[:, None]
    positions = (torch.arange(n)[None, :] - pads[:, None]).clamp(min=0)
    mask = None if bool((pads == 0).all()) else real.long().to(device)
    return Padded(ids, mask, positions.to(device), lengths)
