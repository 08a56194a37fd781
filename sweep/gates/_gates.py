"""The exit rules. Each gate declares its signal, its decision, and what its probe costs.

``decide`` sees one decode step after layer ``l`` (1-indexed) for a batch of rows:
``h`` is h_l and ``h_prev`` is h_{l-1}, both (B, hidden); ``z`` is the logit lens
z_l (B, vocab) when the gate's probe is ``lens``, else None. It returns a bool per row.
``decisions`` is the same rule vectorised over a profile trace and a grid of thresholds,
so a trace can replay a gate without running it. Both paths compute the signal with the
one function of ``sweep.gates._signals`` (the profile writes its trace with them too) and
compare it with the same ``below``/``at_least``/``at_most``. ``token_index`` is the generated token
being decided (0 for the first), set by the engine for thresholds that change over a
generation (CALM's decaying schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from sweep.config.gatespec import GateSpec, check_model, gate_text, setting_columns
from sweep.gates._registry import GATES, register
from sweep.gates._signals import (
    at_least,
    below,
    conformal_tau,
    lens_residual,
    level_tensor,
    logit_margin,
    saturation_delta,
)

if TYPE_CHECKING:
    from sweep.config import GateConfig


class Gate:
    name: ClassVar[str]
    # copied from the gate's row of sweep.config.gatespec.GATE_SPECS by ``register``:
    spec: ClassVar[GateSpec]
    params: ClassVar[tuple[str, ...]] = ()  # GateConfig fields the gate needs (besides min_layer)
    probe: ClassVar[str] = "none"  # none | hidden | lens | pca
    threshold: ClassVar[str | None] = None  # the swept parameter; None when there is none
    aggressive: ClassVar[int] = 1  # +1: a larger threshold exits more often; -1: a smaller one does

    @classmethod
    def decisions(cls, signals, values: torch.Tensor, decay: float | None = None) -> torch.Tensor:
        """Vectorised rule over a profile trace: (K, T, L) booleans, True where the gate with
        threshold ``values[k]`` would exit after layer l+1 at decision position t.
        ``signals`` is a ``sweep.trace.simulate.Signals``; layer and min_layer masking is the caller's;
        ``decay`` is CALM's schedule for the gates that take one."""
        raise NotImplementedError

    def __init__(self, cfg: GateConfig, num_layers: int, hidden_size: int | None = None) -> None:
        self.token_index = 0
        self.gen_tokens = 1
        self.resolved = check_model(cfg, num_layers, hidden_size)  # the one check against the model
        self.min_layer = self.resolved.min_layer
        self.cfg = cfg
        self.num_layers = num_layers

    def probe_layers(self) -> range:
        """Layers after which the decision is taken (never after L: that is full depth)."""
        return range(self.min_layer, self.num_layers)

    readouts = None  # ``sweep.trace.readouts.Readouts``: the fitted readouts (gate.lens=tuned, gate=classifier)
    adapter = None

    def attach(self, readouts) -> None:
        """The fitted readouts (``sweep.trace.readouts.load_readouts``, checked against the model) that a
        tuned lens or the classifier reads."""
        self.readouts = readouts

    def bind(self, adapter) -> None:
        """Called once per engine with the model's adapter (a gate that needs model weights)."""
        self.adapter = adapter

    def readout(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of h_l (``h`` (B, hidden)) as this gate reads them: the probe's lens and the exited
        token's logits. The logit lens, or with gate.lens=tuned layer l's translator first."""
        if self.cfg.lens == "tuned":
            if self.readouts is None:
                raise RuntimeError(f"gate={self.name} lens=tuned used before attach(readouts)")
            return self.readouts.lens(self.adapter, layer, h, "tuned")
        return self.adapter.lens(h)

    @property
    def probe_key(self) -> str:
        """Which measured probe cost applies (``CostModel.probe_ms``): a tuned lens probe adds its translator."""
        return "lens:tuned" if self.probe == "lens" and self.cfg.lens == "tuned" else self.probe

    def calibrate(self, lens_fn, hidden: list[torch.Tensor], mask: torch.Tensor | None = None) -> float:
        """Per-prompt preparation from the prefill's hidden states [h_0..h_L] (each (B, P, hidden)), with
        ``lens_fn(layer, h)`` the gate's readout (``readout``: layer L's is the model's own head);
        returns seconds spent. ``mask`` (B, P), when given, marks each row's real positions (a
        left-padded batch): padding must not count."""
        return 0.0

    def calibration_lenses(self) -> int:
        """Logit-lens passes over every prompt position that ``calibrate`` makes (its cost in
        the cost model); 0 for gates without calibration."""
        return 0

    def decide(self, layer: int, h: torch.Tensor, h_prev: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def values(self) -> dict:
        """The setting as the results tables carry it: every gate column (null where the gate
        does not take it), layer indices as resolved for the model."""
        return setting_columns(self.cfg, self.resolved)

    def describe(self) -> str:
        return f"gate={self.name} " + gate_text(self.values())


@register
class FullGate(Gate):
    """Never exits: the full-depth baseline."""

    name = "full"

    def probe_layers(self) -> range:
        return range(0)

    def decide(self, layer, h, h_prev, z):
        return torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return torch.zeros((len(values), *signals.delta.shape), dtype=torch.bool)


@register
class SkipGate(FullGate):
    """Never exits, as full depth: it names the skip-set draft of self-speculation
    (``sweep.decode.speculative.SkipDraft``)."""

    name = "skip"


@register
class FixedGate(Gate):
    """Always exits after ``exit_layer`` (null: after min_layer): the speedup ceiling and the
    cost model's yardstick."""

    name = "fixed"

    def __init__(self, cfg: GateConfig, num_layers: int, hidden_size: int | None = None) -> None:
        super().__init__(cfg, num_layers, hidden_size)
        self.exit_layer = self.resolved.exit_layer

    def probe_layers(self) -> range:
        return range(self.exit_layer, self.exit_layer + 1) if self.exit_layer < self.num_layers else range(0)

    def decide(self, layer, h, h_prev, z):
        return torch.full((h.shape[0],), layer == self.exit_layer, dtype=torch.bool, device=h.device)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        layers = torch.arange(1, signals.num_layers + 1)
        mask = layers[None, :] == values.long()[:, None]  # (K, L)
        return mask[:, None, :].expand(len(values), *signals.delta.shape)


@register
class SaturationGate(Gate):
    """Exit when the residual stream stops moving: delta < eps (free: no lm_head)."""

    name = "saturation"

    def decide(self, layer, h, h_prev, z):
        return below(saturation_delta(h, h_prev), self.cfg.eps)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return below(signals.delta[None], level_tensor(values)[:, None, None])


@register
class MarginGate(Gate):
    """Exit when the logit lens is decisive: gamma_l >= theta (costs norm + lm_head per probe)."""

    name = "margin"

    def decide(self, layer, h, h_prev, z):
        return at_least(logit_margin(z), self.cfg.theta)

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return at_least(signals.margin[None], level_tensor(values)[:, None, None])


@register
class ConformalGate(Gate):
    """Exit when 2 * tau_l <= gamma_l: the lens's top-1 provably equals the final one if
    ||z_l - z_L||_inf <= tau_l. tau_l is the q-quantile of that residual over the prompt's
    prefill positions, so q = 1.0 makes it lossless on those positions ("miss, not lie").
    """

    name = "conformal"

    def __init__(self, cfg: GateConfig, num_layers: int, hidden_size: int | None = None) -> None:
        super().__init__(cfg, num_layers, hidden_size)
        self.tau: torch.Tensor | None = None

    def calibrate(self, lens_fn, hidden, mask=None):
        import time

        t0 = time.perf_counter()
        z_final = lens_fn(self.num_layers, hidden[self.num_layers])  # (B, P, vocab): one tau per sequence
        tau = torch.full((z_final.shape[0], self.num_layers + 1), float("inf"))
        for layer in self.probe_layers():
            residual = lens_residual(lens_fn(layer, hidden[layer]), z_final).cpu()
            if mask is not None:  # padded positions are NaN, which conformal_tau leaves out
                residual = residual.masked_fill(~mask.cpu(), float("nan"))
            tau[:, layer] = conformal_tau(residual, self.cfg.q)
        self.tau = tau
        return time.perf_counter() - t0

    def calibration_lenses(self) -> int:
        return len(self.probe_layers()) + 1  # every probed layer, and layer L to compare with

    def decide(self, layer, h, h_prev, z):
        assert self.tau is not None, "conformal gate used before calibrate()"
        return at_least(logit_margin(z), 2.0 * level_tensor(self.tau[:, layer]))

    @classmethod
    def decisions(cls, signals, values, decay=None):
        # tau per (q, prompt, layer): the q-quantile of each prompt's prefill residuals, as calibrate() does
        tau = torch.stack([conformal_tau(r.T, values) for r in signals.prefill_residual], dim=1)  # (K, prompts, L)
        return at_least(signals.margin[None], 2.0 * level_tensor(tau[:, signals.prompt_index, :]))


def decayed(threshold, token_index, gen_tokens: int, tau: float | None) -> torch.Tensor:
    """CALM's decaying threshold (Schuster et al. 2022): clip(0.9 * threshold + 0.1 * exp(-tau * t / N), 0, 1)
    for the t-th of N generated tokens; the threshold itself when tau is None. Numbers or
    tensors (broadcast), computed in float64 for the engine and the replay alike."""
    threshold = level_tensor(threshold)
    if tau is None:
        return threshold
    t = level_tensor(token_index)
    return (0.9 * threshold + 0.1 * torch.exp(-tau * t / gen_tokens)).clamp(0.0, 1.0)


def make_gate(cfg: GateConfig, num_layers: int, hidden_size: int | None = None) -> Gate:
    """The gate ``cfg`` names, checked against a model of ``num_layers`` layers (and hidden size)."""
    return GATES.get(cfg.name, key="gate")(cfg, num_layers, hidden_size)
