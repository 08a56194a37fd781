"""The exit rules. Each gate declares its signal, its decision, and what its probe costs.

``decide`` sees one decode step after layer ``l`` (1-indexed) for a batch of rows:
``h`` is h_l and ``h_prev`` is h_{l-1}, both (B, hidden); ``z`` is the logit lens
z_l (B, vocab) when the gate's probe is ``lens``, else None. It returns a bool per row.
``decisions`` is the same rule vectorised over a profile trace and a grid of thresholds,
so a trace can replay a gate without running it. Both paths compute the signal with the
one function of ``sweep.gates.signals`` (the profile writes its trace with them too) and
compare it with the same ``below``/``at_least``/``at_most``.

A gate is complete when built (``make_gate(cfg, lm, readouts)``: the model's adapter and the fitted
readouts it reads) and immutable for a run. What changes during a generation is the decoder's, passed
to ``decide`` as ``at`` (``Decoding``): the generated token being decided (0 for the first) of how
many (CALM's decaying schedule), and the prompt's calibration (conformal's tau, from ``calibrate``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sweep.gates.spec import GATES, GateSpec, check_model, gate_text, setting_columns

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Decoding:
    """Where a generation stands when a gate decides: the generated token being decided (0 for the first,
    decided from the prefill) of ``of``, and what the gate's ``calibrate`` returned for this prompt."""

    token: int = 0
    of: int = 1
    calibration: Any = None


FIRST = Decoding()


class Gate:
    name: ClassVar[str]
    # copied from the gate's registration (``sweep.gates.spec.register``):
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

    def __init__(
        self, cfg: Any, num_layers: int, hidden_size: int | None = None, *, adapter=None, readouts=None
    ) -> None:
        """Use ``make_gate``. ``adapter``: the model's (``sweep.models.Adapter``), None for a gate that only
        replays a trace (``decisions``); ``readouts``: the fitted readouts a tuned lens or the classifier
        reads (``sweep.gates.readouts.load_readouts``, checked against the model)."""
        self.resolved = check_model(cfg, num_layers, hidden_size)  # the one check against the model
        self.min_layer = self.resolved.min_layer
        self.cfg = cfg
        self.num_layers = num_layers
        self.adapter = adapter
        self.readouts = readouts
        if adapter is not None and readouts is None and self.needs_readouts:
            raise ValueError(f"gate={self.name} lens={cfg.lens}: built without the fitted readouts it reads")

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_sealed"):
            raise AttributeError(f"gate={self.name}: a gate is immutable once built (make_gate); {name} not set")
        object.__setattr__(self, name, value)

    def seal(self) -> Gate:
        """Make the gate immutable (``make_gate`` does, once it is complete)."""
        object.__setattr__(self, "_sealed", True)
        return self

    def probing_from(self, layer: int) -> Gate:
        """A new gate with this one's rule, model and readouts that decides after every layer from
        ``layer`` on (the cost model's probed steps); this gate is left as it is."""
        other = copy.copy(self)
        object.__setattr__(other, "min_layer", layer)
        return other

    @property
    def needs_readouts(self) -> bool:
        """True when the gate reads fitted readouts: a tuned lens (the classifier's own rule adds its own)."""
        return self.cfg.lens == "tuned"

    def probe_layers(self) -> range:
        """Layers after which the decision is taken (never after L: that is full depth)."""
        return range(self.min_layer, self.num_layers)

    def readout(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of h_l (``h`` (B, hidden)) as this gate reads them: the probe's lens and the exited
        token's logits. The logit lens, or with gate.lens=tuned layer l's translator first."""
        if self.adapter is None:
            raise RuntimeError(f"gate={self.name} built without a model reads no hidden state (make_gate(cfg, lm))")
        if self.cfg.lens == "tuned":
            return self.readouts.lens(self.adapter, layer, h, "tuned")
        return self.adapter.lens(h)

    @property
    def probe_key(self) -> str:
        """Which measured probe cost applies (``CostModel.probe_ms``): a tuned lens probe adds its translator."""
        return "lens:tuned" if self.probe == "lens" and self.cfg.lens == "tuned" else self.probe

    def calibrate(self, lens_fn, hidden: list[torch.Tensor], mask: torch.Tensor | None = None):
        """Per-prompt preparation from the prefill's hidden states [h_0..h_L] (each (B, P, hidden)), with
        ``lens_fn(layer, h)`` the gate's readout (``readout``: layer L's is the model's own head); what
        it returns is ``Decoding.calibration`` for this prompt's decisions (None: nothing). ``mask``
        (B, P), when given, marks each row's real positions (a left-padded batch): padding must not count."""
        return None

    def calibration_lenses(self) -> int:
        """Logit-lens passes over every prompt position that ``calibrate`` makes (its cost in
        the cost model); 0 for gates without calibration."""
        return 0

    def decide(
        self, layer: int, h: torch.Tensor, h_prev: torch.Tensor, z: torch.Tensor | None, at: Decoding = FIRST
    ) -> torch.Tensor:
        raise NotImplementedError

    def values(self) -> dict:
        """The setting as the results tables carry it: every gate column (null where the gate
        does not take it), layer indices as resolved for the model."""
        return setting_columns(self.cfg, self.resolved)

    def describe(self) -> str:
        return f"gate={self.name} " + gate_text(self.values())


def make_gate(cfg: Any, model, readouts=None) -> Gate:
    """The gate ``cfg`` names, checked against ``model`` and complete: ``model`` is a loaded model
    (``sweep.models.LoadedModel``: its adapter, layer count and hidden size) and ``readouts`` the fitted
    readouts the gate reads, if any; or a layer count alone, for a gate that only replays a trace
    (``decisions``) and reads no hidden state. Immutable once built."""
    cls = GATES.get(cfg.name, key="gate").cls
    if isinstance(model, int):
        return cls(cfg, model, readouts=readouts).seal()
    adapter = model.adapter
    return cls(cfg, adapter.num_layers, adapter.config.hidden_size, adapter=adapter, readouts=readouts).seal()
