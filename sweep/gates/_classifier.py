"""The learned exit: CALM's trained exit classifier, fitted by `sweep fit` (``sweep.trace.readouts``)."""

from __future__ import annotations

from sweep.gates.base import FIRST, Gate
from sweep.gates.spec import LENSES, finite, GateSpec, lazy, register

torch = lazy("torch")
sig = lazy("sweep.gates.signals")  # every signal, once (torch: imported when a gate decides)


@register(
    GateSpec(
        "classifier",
        "exits when a fitted exit classifier on h_l says p(layer l's top-1 is the final one) >= theta (CALM)",
        probe="classifier",
        signal="classifier_prob",
        params=("theta",),
        threshold="theta",
        aggressive=-1,
        domains={"theta": finite(lambda v: 0 <= v <= 1, "in [0, 1] (a probability)")},
        units={"theta": "probability"},
        ladder="range(0.5, 1.0001, step=0.02)",
        lenses=LENSES,
        readouts=True,
    )
)
class ClassifierGate(Gate):
    """Exit when a fitted exit classifier (``sweep fit``: logistic regression on final_norm(h_l),
    log delta and cos(h_l, h_{l-1})) gives p(layer l's top-1 equals the final one) >= theta; the
    token comes from the gate's lens (logit, or tuned). A dot product per probe: no lm_head until it exits."""

    def decide(self, layer, h, h_prev, z, at=FIRST):
        return sig.at_least(self.readouts.classifier_prob(layer, h, h_prev, self.lens), self.cfg.theta)

    needs_readouts = True  # its rule is the fitted classifier, whatever lens it reads

    @property
    def lens(self) -> str:
        """The lens whose top-1 the classifier was fitted to predict (null in a config built in code: logit)."""
        return self.cfg.lens or "logit"

    @property
    def probe_key(self) -> str:
        return f"classifier:{self.lens}"

    @classmethod
    def decisions(cls, signals, values, decay=None):
        return sig.at_least(signals.need("classifier_prob")[None], sig.level_tensor(values)[:, None, None])
