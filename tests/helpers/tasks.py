"""Helpers of the task tests: a gate threshold that exits on some of a HumanEval prompt's tokens."""

from __future__ import annotations

import torch


def humaneval_eps(lm, min_layer: int = 1) -> float:
    """On a HumanEval prompt, the median over positions of each position's smallest saturation delta in layers
    >= min_layer: a gate at it exits on some tokens and not on others."""
    from sweep.tasks.humaneval import problems

    ids = torch.tensor([lm.tokenizer(problems(1)[0]["prompt"])["input_ids"]])
    with torch.no_grad():
        hs = lm.model(ids, output_hidden_states=True).hidden_states
    deltas = [((hs[i] - hs[i - 1]).norm(dim=-1) / hs[i].norm(dim=-1)).flatten() for i in range(min_layer, len(hs) - 1)]
    return float(torch.stack(deltas).min(dim=0).values.median())  # about half the positions have a layer below it
