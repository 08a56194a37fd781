"""Decode loops over the model's own forward with a KV cache."""

from __future__ import annotations

from typing import Sequence

import torch

from sweep.models import LoadedModel


@torch.inference_mode()
def greedy_decode(lm: LoadedModel, prompt_ids: Sequence[int], n_tokens: int) -> list[int]:
    """Full-depth greedy decoding of exactly ``n_tokens`` tokens (EOS does not stop it).

    A fixed length keeps runs comparable token for token; the tokens stay on the
    device until the end so a GPU is never synchronised per step.
    """
    adapter = lm.adapter
    cache = adapter.new_cache()
    ids = torch.tensor([list(prompt_ids)], device=lm.device)
    token = adapter.forward(ids, cache)[:, -1].argmax(-1, keepdim=True)
    out = [token]
    for _ in range(n_tokens - 1):
        token = adapter.forward(token, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(token)
    return torch.cat(out, dim=1)[0].tolist()
