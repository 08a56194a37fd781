"""CALM's confidence signals (Schuster et al. 2022, arXiv 2207.07061) as gates: softmax
response (top-1 minus top-2 probability), hidden-state saturation as a cosine, and the
entropy of the early-exit distribution. softmax and cosine take CALM's decaying threshold
schedule (``gate.decay`` = its tau; null keeps the threshold fixed)."""

from __future__ import annotations

from sweep.gates.base import FIRST, Decoding, Gate
from sweep.gates.spec import LENSES, finite, GateSpec, lazy, register

torch = lazy("torch")
sig = lazy("sweep.gates.signals")  # every signal, once (torch: imported when a gate decides)


class _Decaying(Gate):
    """A gate whose threshold may follow CALM's decaying schedule over the generation."""

    def level(self, base, at: Decoding) -> torch.Tensor:
        """The threshold (float64) at ``at``, decayed over the generation when gate.decay is set."""
        return sig.decayed(base, at.token, at.of, self.cfg.decay)

    @classmethod
    def levels(cls, signals, values, decay: float | None) -> torch.Tensor:
        """(K, T, 1) thresholds per position (float64), decayed over each prompt's generation
        by the same ``decayed`` the engine's ``level`` uses."""
        return sig.decayed(
            sig.level_tensor(values)[:, None, None], signals.token_index[None, :, None], signals.gen_tokens, decay
        )


@register(
    GateSpec(
        "softmax",
        "exits when the lens's top-1 minus top-2 probability >= theta (CALM)",
        probe="lens",
        signal="prob_margin",
        params=("theta",),
        optional=("decay",),
        threshold="theta",
        aggressive=-1,
        domains={"theta": finite(lambda v: 0 <= v <= 1, "in [0, 1] (a probability margin)")},
        units={"theta": "probability"},
        lenses=LENSES,
    )
)
class SoftmaxGate(_Decaying):
    """Exit when the lens's softmax is decisive: p_top1 - p_top2 >= theta (theta in [0, 1])."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.at_least(sig.prob_margin(z), self.level(self.cfg.theta, at))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.at_least(signals.need("prob_margin")[None], cls.levels(signals, values, decay))


@register(
    GateSpec(
        "cosine",
        "exits when cos(h_l, h_{l-1}) >= 1 - eps (CALM)",
        probe="hidden",
        signal="cos_prev",
        params=("eps",),
        optional=("decay",),
        threshold="eps",
    )
)
class CosineGate(_Decaying):
    """Exit when the residual stream stops turning: cos(h_l, h_{l-1}) >= 1 - eps."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.at_least(sig.cosine_prev(h, h_prev), self.level(1.0 - sig.level_tensor(self.cfg.eps), at))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.at_least(signals.need("cos_prev")[None], cls.levels(signals, 1.0 - sig.level_tensor(values), decay))


@register(
    GateSpec(
        "entropy",
        "exits when the entropy of the lens's softmax <= theta (nats)",
        probe="lens",
        signal="entropy",
        params=("theta",),
        threshold="theta",
        units={"theta": "nats"},
        lenses=LENSES,
    )
)
class EntropyGate(Gate):
    """Exit when the lens's distribution is peaked: its entropy <= theta (nats)."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.at_most(sig.entropy(z), self.cfg.theta)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.at_most(signals.need("entropy")[None], sig.level_tensor(values)[:, None, None])
