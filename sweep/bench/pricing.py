"""The cost model: what one layer, the exit probe, the K/V fill and the rest of a decode
step cost on this model and device, measured, and what a gate's exits should save.

Everything is measured on decode steps of the real model with a real KV cache (median
of interleaved repeats, synchronised on GPU). Costs are kept in ms and expressed in
layer-equivalents (ms / layer_ms), the unit the post-mortem's probe costs use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from sweep.gates import Gate


@dataclass
class DecodeSteps:
    """Gated decode steps as the cost model charges them: the layers each ran (its exit layer;
    L when it did not exit), its probes, and the extra heads and K/V fill layers only a batch
    pays (a batch's step runs to its deepest row; see ``BatchGeneration``)."""

    layers: list[int]
    probes: list[int]
    extra_heads: list[int] = field(default_factory=list)
    extra_fills: list[int] = field(default_factory=list)

    @classmethod
    def of_batches(cls, gens: list) -> DecodeSteps:
        def joined(name: str) -> list[int]:
            return [v for gen in gens for v in getattr(gen, name)]

        return cls(joined("step_layers"), joined("probes"), joined("extra_heads"), joined("extra_fill_layers"))


@dataclass
class CostModel:
    layer_ms: float  # one decoder layer of a decode step
    head_ms: float  # final norm + lm_head on one position (the logit lens)
    # the probes alone, measured on demand (``cost_model(..., probes_alone=True)``; None until then): what a
    # gate whose probe was not measured in situ is charged; a bench and a screen measure their gates' in situ
    lens_probe_ms: float | None  # a margin/conformal probe alone: lens + top-2 + decision
    hidden_probe_ms: float | None  # a saturation probe alone: two norms of h + decision
    # K/V fill of one skipped layer (kv_policy=propagate), by the path the engine takes; None until a
    # kv_policy=propagate trial needs it (``cost_model(..., kv_policy=...)``), and for a model without a fill
    kv_ms: float | None
    overhead_ms: float  # rest of a full-depth step: embedding, mask, RoPE, framework
    step_ms: float  # a full-depth decode step, measured
    num_layers: int
    prefill_ms: float = 0.0  # a full-depth prefill of the measured prompt (prompt_tokens long)
    prefill_lens_ms: float = 0.0  # the logit lens and its sup-norm residual over every position of that prompt
    prompt_tokens: int = 1
    # measured on demand: each gate's probe in situ (``_measure``, ``_measure_probe``) under ``in_situ_key``
    # ("margin/lens", "saturation/hidden", "pca/pca:64", "classifier/classifier:tuned"), which wins over the
    # probe measured alone; "translate": a tuned lens's translator alone (an exit's cost)
    extra_probe_ms: dict = field(default_factory=dict)
    # measured on demand for self-speculation (``cost_model(..., verify_positions=N + 1)``): one layer's
    # attention and MLP sublayers of a decode step, and a verification pass of k positions (verify_ms[k - 1])
    attn_ms: float | None = None
    mlp_ms: float | None = None
    mixer_ms: float | None = None  # a state-space mixer's (models that have one; None otherwise)
    verify_ms: list = field(default_factory=list)
    # fresh: measured in this process; cached: this machine's cost cache, after its check (``sweep.bench.costs_cache``)
    source: str = "fresh"

    def layers(self, ms: float) -> float:
        return ms / self.layer_ms

    def verify(self, positions: int) -> float:
        """ms of one full-model pass over ``positions`` positions on a cache (a verification)."""
        if positions > len(self.verify_ms):
            raise KeyError(f"verification of {positions} positions not measured: cost_model(..., verify_positions=...)")
        return self.verify_ms[positions - 1]

    def skip_draft_ms(self, skip) -> float:
        """ms of a draft step of the full model with the sublayers of ``skip`` bypassed."""
        if self.attn_ms is None or self.mlp_ms is None:
            raise KeyError("sublayer costs not measured: cost_model(..., verify_positions=...)")
        mixers = len(getattr(skip, "mixer", ())) * (self.mixer_ms or 0.0)
        return max(self.step_ms - len(skip.attention) * self.attn_ms - len(skip.mlp) * self.mlp_ms - mixers, 0.0)

    def prefix_draft_ms(self, exit_layer: int) -> float:
        """ms of a draft step of layers 1..K and the logit lens."""
        return self.overhead_ms + exit_layer * self.layer_ms + self.head_ms

    def speculative_ms(self, draft_step_ms: float, drafted: Sequence[int], draft_steps: Sequence[int]) -> float:
        """Predicted decode ms of self-speculation whose rounds kept ``drafted[r]`` drafts after
        ``draft_steps[r]`` draft passes (one more than kept where ``bench.draft_stop`` dropped a draft): every
        pass at ``draft_step_ms`` (``prefix_draft_ms``, ``skip_draft_ms``) and a verification of the kept drafts + 1."""
        return sum(s * draft_step_ms + self.verify(k + 1) for k, s in zip(drafted, draft_steps, strict=True))

    def probe_ms(self, gate: Gate) -> float:
        """ms of one probe of ``gate``: in situ when ``cost_model(..., gates=[gate])`` measured it, else alone."""
        if in_situ_key(gate) in self.extra_probe_ms:
            return self.extra_probe_ms[in_situ_key(gate)]
        known = {"none": 0.0, "hidden": self.hidden_probe_ms, "lens": self.lens_probe_ms, **self.extra_probe_ms}
        if known.get(gate.probe_key) is None:
            raise KeyError(
                f"probe '{gate.probe_key}' not measured: cost_model(lm, prompt_ids, gates=[...]) measures it"
            )
        return known[gate.probe_key]

    def fill_ms(self, kv_policy: str) -> float:
        """What a skipped layer costs a step under ``kv_policy``: its K/V fill (propagate; 0 where no fill
        was measured, which only a gate that never exits can reach), or the layer itself (full)."""
        if kv_policy == "propagate":
            return self.kv_ms or 0.0
        return self.layer_ms

    def token_ms(self, gate: Gate, exit_layer, probes, kv_policy: str):
        """Predicted ms of a decode step that exited at ``exit_layer`` after ``probes`` probes.

        Numbers or tensors (a whole grid of simulated exits at once). A step that did not
        exit pays the head; one that exited pays it unless a lens probe already computed
        the token's logits, and under kv_policy=full also the model's own final head.
        """
        L = self.num_layers
        exited = exit_layer < L
        exited = exited.to(torch.float64) if isinstance(exited, torch.Tensor) else float(exited)
        head_after_exit = (gate.probe != "lens") + (kv_policy == "full")
        return (
            self.overhead_ms
            + exit_layer * self.layer_ms
            + probes * self.probe_ms(gate)
            + (L - exit_layer) * self.fill_ms(kv_policy)
            + self.head_ms * ((1.0 - exited) + exited * head_after_exit)
            + exited * self.exit_translate_ms(gate)
        )

    def exit_translate_ms(self, gate: Gate) -> float:
        """What an exit pays beyond the head to read its token: a tuned lens's translator, unless
        a (tuned) lens probe already read it."""
        if gate.probe == "lens" or gate.cfg.lens != "tuned":
            return 0.0
        if "translate" not in self.extra_probe_ms:
            raise KeyError("the translator's cost is not measured: cost_model(lm, prompt_ids, gates=[...]) measures it")
        return self.extra_probe_ms["translate"]

    def decode_ms(self, gate: Gate, steps: DecodeSteps, kv_policy: str) -> float:
        """Predicted gated ms of the given decode steps; a batch's steps add the heads and K/V
        fills no single sequence pays (see ``DecodeSteps``)."""
        gated = sum(self.token_ms(gate, e, p, kv_policy) for e, p in zip(steps.layers, steps.probes))
        return gated + sum(steps.extra_heads) * self.head_ms + sum(steps.extra_fills) * self.fill_ms(kv_policy)

    def speedup(self, gate: Gate, steps: DecodeSteps, kv_policy: str) -> float:
        """Predicted full-depth ms over gated ms, summed over the given decode steps."""
        gated = self.decode_ms(gate, steps, kv_policy)
        return len(steps.layers) * self.step_ms / gated if gated else float("nan")

    def prefill_at(self, prompt_tokens: int) -> float:
        """Predicted ms of a full-depth prefill of ``prompt_tokens`` tokens (linear in length
        from the measured prompt: an approximation that ignores attention's quadratic term)."""
        return self.prefill_ms * prompt_tokens / self.prompt_tokens

    def calibration_ms(self, gate: Gate, prompt_tokens: int) -> float:
        """Predicted ms of the gate's per-prompt calibration: one lens and residual over every
        prompt position per lens pass it declares (conformal: its probed layers and layer L)."""
        return gate.calibration_lenses() * self.prefill_lens_ms * prompt_tokens / self.prompt_tokens

    def speedup_e2e(self, gate: Gate, steps: DecodeSteps, kv_policy: str, prompt_tokens: Sequence[int]) -> float:
        """Predicted end-to-end speedup of whole requests: every prompt's prefill (and, on the
        gated side, its calibration) plus the given decode steps."""
        prefill = sum(self.prefill_at(p) for p in prompt_tokens)
        calibration = sum(self.calibration_ms(gate, p) for p in prompt_tokens)
        gated = prefill + calibration + self.decode_ms(gate, steps, kv_policy)
        return (prefill + len(steps.layers) * self.step_ms) / gated if gated else float("nan")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def format(self) -> str:
        rows = [
            ("decoder layer", self.layer_ms),
            ("final norm + lm_head", self.head_ms),
            *([("lens probe alone (margin)", self.lens_probe_ms)] if self.lens_probe_ms is not None else []),
            *([("hidden probe alone (saturation)", self.hidden_probe_ms)] if self.hidden_probe_ms is not None else []),
            *([("K/V fill, one layer (propagate)", self.kv_ms)] if self.kv_ms is not None else []),
            ("step overhead", self.overhead_ms),
            (f"full-depth step ({self.num_layers} layers)", self.step_ms),
            (f"prefill, {self.prompt_tokens} tokens", self.prefill_ms),
            (f"lens over {self.prompt_tokens} positions", self.prefill_lens_ms),
        ]
        rows += [(f"probe {key}" if "/" in key else key, ms) for key, ms in sorted(self.extra_probe_ms.items())]
        lines = [f"{'cost model':<34}{'ms':>9}{'layers':>9}"]
        lines += [f"{name:<34}{ms:>9.3f}{self.layers(ms):>9.2f}" for name, ms in rows]
        return "\n".join(lines)


def in_situ_key(gate: Gate) -> str:
    """Under which key ``CostModel.extra_probe_ms`` keeps the in-situ cost of ``gate``'s probe: its
    decision rule and its probe (margin and entropy read the same lens but decide differently)."""
    return f"{gate.name}/{gate.probe_key}"
