"""What every task decodes with: one side of an evaluation (``Side``), a generation's stop rule, the cut at a stop
sequence, the seeded sampler of sampled completions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Side:
    """One side of an evaluation (gated or full depth): per problem its score (pass@1, or the task's metric), per
    problem its samples' completions and token ids, pass@k for each k, and the exit layers of its tokens."""

    scores: list[float]
    completions: list[list[str]]
    tokens: list[list[list[int]]]
    exit_layers: list[int]
    pass_at: dict[int, float]
    metric: str
    isolation: str | None = None
    # problems scored before the side stopped (search.max_accuracy_loss: its loss over all problems was already
    # certain to exceed it); None when every problem ran
    stopped_at: int | None = None
    loss_min: float | None = None  # then: the certain lower bound on the loss over all problems

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.scores)) if self.scores else float("nan")


def stop_at(tokenizer, stops: tuple[str, ...], eos: int | None) -> Callable[[list[int]], bool]:
    """A generation's stop rule: the end-of-sequence token, or a stop sequence in the decoded text."""

    def stop(ids: list[int]) -> bool:
        if eos is not None and ids and ids[-1] == eos:
            return True
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stops)

    return stop


def cut(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to its first stop sequence."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:at]


def sampler(temperature: float, seed: int) -> Callable:
    """Token ``index`` drawn from softmax(logits / temperature), from a generator seeded per completion."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def pick(logits, index: int):
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).to(logits.device)

    return pick
