"""CALM's confidence signals (Schuster et al. 2022, arXiv 2207.07061) as gates: softmax
response (top-1 minus top-2 probability), hidden-state saturation as a cosine, and the
entropy of the early-exit distribution. softmax and cosine take CALM's decaying threshold
schedule (``gate.decay`` = its tau; null keeps the threshold fixed)."""

from __future__ import annotations

import torch

from sweep.gates._gates import FIRST, Decoding, Gate, decayed
from sweep.gates._registry import register
from sweep.gates._signals import at_least, at_most, cosine_prev, entropy, level_tensor, prob_margin


class _Decaying(Gate):
    """A gate whose threshold may follow CALM's decaying schedule over the generation."""

    def level(self, base, at: Decoding) -> torch.Tensor:
        """The threshold (float64) at ``at``, decayed over the generation when gate.decay is set."""
        return decayed(base, at.token, at.of, self.cfg.decay)

    @classmethod
    def levels(cls, signals, values, decay: float | None) -> torch.Tensor:
        """(K, T, 1) thresholds per position (float64), decayed over each prompt's generation
        by the same ``decayed`` the engine's ``level`` uses."""
        return decayed(
            level_tensor(values)[:, None, None], signals.token_index[None, :, None], signals.gen_tokens, decay
        )


@register
class SoftmaxGate(_Decaying):
    """Exit when the lens's softmax is decisive: p_top1 - p_top2 >= theta (theta in [0, 1])."""

    name = "softmax"

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return at_least(prob_margin(z), self.level(self.cfg.theta, at))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return at_least(signals.need("prob_margin")[None], cls.levels(signals, values, decay))


@register
class CosineGate(_Decaying):
    """Exit when the residual stream stops turning: cos(h_l, h_{l-1}) >= 1 - eps."""

    name = "cosine"

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return at_least(cosine_prev(h, h_prev), self.level(1.0 - level_tensor(self.cfg.eps), at))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return at_least(signals.need("cos_prev")[None], cls.levels(signals, 1.0 - level_tensor(values), decay))


@register
class EntropyGate(Gate):
    """Exit when the lens's distribution is peaked: its entropy <= theta (nats)."""

    name = "entropy"

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return at_most(entropy(z), self.cfg.theta)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return at_most(signals.need("entropy")[None], level_tensor(values)[:, None, None])
