"""The baseline and the first exit rules: full depth, the drafts (a fixed prefix of layers, a skip set), and
the saturation, margin and conformal gates."""

from __future__ import annotations

from sweep.gates.base import FIRST, Gate
from sweep.gates.spec import LENSES, GateSpec, lazy, register

torch = lazy("torch")
sig = lazy("sweep.gates.signals")  # every signal, once (torch: imported when a gate decides)


@register(GateSpec("full", "never exits: the full-depth baseline", probe="none", signal=None))
class FullGate(Gate):
    """Never exits: the full-depth baseline."""

    def probe_layers(self) -> range:
        return range(0)

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return torch.zeros((len(values), *signals.delta.shape), dtype=torch.bool)


@register(
    GateSpec(
        "skip",
        "never exits: drafts for bench.mode=self_speculative with the full model minus the sublayers in skip",
        probe="none",
        signal=None,
        params=("skip",),
    )
)
class SkipGate(FullGate):
    """Never exits, as full depth: it names the skip-set draft of self-speculation
    (``sweep.decode.speculative.SkipDraft``)."""


@register(
    GateSpec(
        "fixed",
        "always exits after exit_layer (null: after min_layer): the speedup ceiling",
        probe="none",
        signal=None,
        optional=("exit_layer",),
        threshold="exit_layer",
        aggressive=-1,
    )
)
class FixedGate(Gate):
    """Always exits after ``exit_layer`` (null: after min_layer): the speedup ceiling and the
    cost model's yardstick."""

    def __init__(self, cfg, num_layers: int, hidden_size: int | None = None, **parts) -> None:
        super().__init__(cfg, num_layers, hidden_size, **parts)
        self.exit_layer = self.resolved.exit_layer

    def probe_layers(self) -> range:
        return range(self.exit_layer, self.exit_layer + 1) if self.exit_layer < self.num_layers else range(0)

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return torch.full((h.shape[0],), layer == self.exit_layer, dtype=torch.bool, device=h.device)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        layers = torch.arange(1, signals.num_layers + 1)
        mask = layers[None, :] == values.long()[:, None]  # (K, L)
        return mask[:, None, :].expand(len(values), *signals.delta.shape)


@register(
    GateSpec(
        "saturation",
        "exits when delta = ||h_l - h_{l-1}|| / ||h_l|| < eps",
        probe="hidden",
        signal="delta",
        params=("eps",),
        threshold="eps",
        ladder="range(0.02, 0.62, step=0.02)",
    )
)
class SaturationGate(Gate):
    """Exit when the residual stream stops moving: delta < eps (free: no lm_head)."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.below(sig.saturation_delta(h, h_prev), self.cfg.eps)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.below(signals.delta[None], sig.level_tensor(values)[:, None, None])


@register(
    GateSpec(
        "margin",
        "exits when the logit lens's top1 - top2 >= theta (logits)",
        probe="lens",
        signal="margin",
        params=("theta",),
        threshold="theta",
        aggressive=-1,
        units={"theta": "logits"},
        ladder="range(0.5, 30.5, step=0.5)",
        lenses=LENSES,
    )
)
class MarginGate(Gate):
    """Exit when the logit lens is decisive: gamma_l >= theta (costs norm + lm_head per probe)."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.at_least(sig.logit_margin(z), self.cfg.theta)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.at_least(signals.margin[None], sig.level_tensor(values)[:, None, None])


@register(
    GateSpec(
        "conformal",
        "exits when 2 tau_l <= gamma_l, tau_l the q-quantile of the prefill's lens residuals",
        probe="lens",
        signal="margin",
        params=("q",),
        threshold="q",
        aggressive=-1,
        ladder="range(0.05, 1.0001, step=0.05)",
        lenses=LENSES,
    )
)
class ConformalGate(Gate):
    """Exit when 2 * tau_l <= gamma_l: the lens's top-1 provably equals the final one if
    ||z_l - z_L||_inf <= tau_l. tau_l is the q-quantile of that residual over the prompt's
    prefill positions, so q = 1.0 makes it lossless on those positions ("miss, not lie").
    """

    def calibrate(self, lens_fn, hidden, mask=None):
        """tau per batch row and layer (B, L + 1): what ``decide`` compares the margin with."""
        z_final = lens_fn(self.num_layers, hidden[self.num_layers])  # (B, P, vocab): one tau per sequence
        tau = torch.full((z_final.shape[0], self.num_layers + 1), float("inf"))
        for layer in self.probe_layers():
            residual = sig.lens_residual(lens_fn(layer, hidden[layer]), z_final).cpu()
            if mask is not None:  # padded positions are NaN, which conformal_tau leaves out
                residual = residual.masked_fill(~mask.cpu(), float("nan"))
            tau[:, layer] = sig.conformal_tau(residual, self.cfg.q)
        return tau

    def calibration_lenses(self) -> int:
        return len(self.probe_layers()) + 1  # every probed layer, and layer L to compare with

    def decide(self, layer, h, h_prev, z, at=FIRST):
        if at.calibration is None:
            raise RuntimeError("gate=conformal decides from its prompt's calibration (Decoding.calibration)")
        return sig.at_least(sig.logit_margin(z), 2.0 * sig.level_tensor(at.calibration[:, layer]))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        # tau per (q, prompt, layer): the q-quantile of each prompt's prefill residuals, as calibrate() does
        tau = torch.stack([sig.conformal_tau(r.T, values) for r in signals.prefill_residual], dim=1)  # (K, prompts, L)
        return sig.at_least(signals.margin[None], 2.0 * sig.level_tensor(tau[:, signals.prompt_index, :]))
