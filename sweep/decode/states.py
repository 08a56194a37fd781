"""Full-depth greedy decoding with every layer's residual stream captured (``decode_states``): the
states the profile traces and the readouts are fitted on, from the forwards the engine runs."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from sweep.models import LoadedModel


class DecodedStates(NamedTuple):
    tokens: list[int]  # the tokens fed back (greedy, or the ones given)
    states: list[torch.Tensor]  # [h_0..h_L], each (1, P + n - 1, hidden)
    greedy: list[int]  # per step, the argmax of the model's own logits (the full-depth token)


@torch.inference_mode()
def decode_states(
    lm: LoadedModel, prompt_ids: Sequence[int], *, generated: Sequence[int] | None = None, n_tokens: int | None = None
) -> DecodedStates:
    """Full-depth greedy decoding with every layer's residual stream captured: the prefill, then
    one step per token through the KV cache, exactly the forwards the engine runs (kv_policy=full
    up to its first divergence). Feeds ``generated`` when given, else decodes ``n_tokens`` greedy
    tokens. The last token is not fed, so the states cover P + n - 1 positions.
    """
    adapter, L = lm.adapter, lm.num_layers
    n = len(generated) if generated is not None else n_tokens
    if n is None or n < 1:
        raise ValueError(f"decode_states: {n} tokens; at least 1 (pass generated or n_tokens)")
    cache = adapter.new_cache()
    tokens: list[int] = []
    greedy: list[int] = []
    steps: list[list[torch.Tensor]] = []
    feed = list(prompt_ids)
    for step in range(n):
        with adapter.capture_hidden() as hs:
            logits = adapter.forward(torch.tensor([feed], device=lm.device), cache)[:, -1]
        assert len(hs) == L + 1, f"captured {len(hs)} hidden states for {L} layers"
        greedy.append(int(logits.argmax(-1)))
        tokens.append(int(generated[step]) if generated is not None else greedy[-1])
        steps.append(hs)  # step 0 fed the prompt, step s > 0 fed tokens[s - 1]
        feed = [tokens[-1]]
    return DecodedStates(tokens, [torch.cat([hs[layer] for hs in steps], dim=1) for layer in range(L + 1)], greedy)
