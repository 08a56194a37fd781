"""The estimators behind the trial table's headline figures, defined once.

The bench computes its point estimates with these functions and `sweep.analysis` bootstraps
the very same functions, so an interval always belongs to the statistic it is printed
beside. Plain numpy: a leading batch axis evaluates many resamples at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def pooled_speedup(baseline: np.ndarray, gated: np.ndarray) -> np.ndarray | float:
    """Median over rounds of (baseline time summed over units / gated time summed over units).

    ``baseline`` and ``gated`` are seconds (or ms) shaped (..., rounds, units): a unit is one
    prompt, or one batch of prompts decoded together. Each round times every unit on both
    sides, interleaved, so a round's ratio compares like with like; the median over rounds
    resists one disturbed round.
    """
    base, gate = np.asarray(baseline, dtype=float), np.asarray(gated, dtype=float)
    out = np.median(base.sum(axis=-1) / gate.sum(axis=-1), axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def mean_agreement(per_prompt: np.ndarray) -> np.ndarray | float:
    """Mean over prompts (last axis) of per-prompt agreement; every prompt generates the same
    number of tokens, so this equals the fraction of all generated positions that agree."""
    out = np.asarray(per_prompt, dtype=float).mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


@dataclass
class Timings:
    """Seconds per side, [round][unit]: a unit is one prompt, or one batch of prompts decoded
    together. Prefill covers the request before the first decode step: prefill, the gate's
    calibration and the first token's decision; decode covers tokens 2..n."""

    base_decode: list[list[float]]
    gated_decode: list[list[float]]
    base_prefill: list[list[float]]
    gated_prefill: list[list[float]]

    @classmethod
    def empty(cls, repeats: int, units: int) -> "Timings":
        return cls(*([[0.0] * units for _ in range(repeats)] for _ in range(4)))

    def speedup(self) -> float:
        """speedup_wall: decode only."""
        return pooled_speedup(self.base_decode, self.gated_decode)

    def speedup_e2e(self) -> float:
        """speedup_e2e_wall: whole requests, prefill and calibration included."""
        return pooled_speedup(
            np.add(self.base_decode, self.base_prefill), np.add(self.gated_decode, self.gated_prefill)
        )

    def columns(self) -> dict[str, list[list[float]]]:
        """The trial table's round_* columns, in ms."""

        def ms(m):
            return [[v * 1000 for v in row] for row in m]

        return {
            "round_baseline_ms": ms(self.base_decode),
            "round_ms": ms(self.gated_decode),
            "round_baseline_prefill_ms": ms(self.base_prefill),
            "round_prefill_ms": ms(self.gated_prefill),
        }
