"""The estimators behind the trial table's headline figures, defined once.

The bench computes its point estimates with these functions and `sweep.analysis` bootstraps
the very same functions, so an interval always belongs to the statistic it is printed
beside. The ranked speedup (``ranked_speedup``: capped from above where no compute was skipped,
1.0 inside the trial's noise floor) is what fronts, targets, knees, verdicts and the Optuna
objective all use; the noise floor (``sweep.bench.noise.noise_floor``) comes from the A/A control, full
depth timed against full depth in the same rounds. Plain numpy: a leading batch axis evaluates many
resamples at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from sweep.bench.noise import noise_floor

FLOOR_OF = {"speedup_wall": "noise_floor", "speedup_e2e_wall": "noise_floor_e2e"}  # each speedup's A/A floor


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
    number of tokens, so this equals the fraction of all generated positions that agree.

    One mean (a row's figure) is the exact mean of the prompts' fractions, rounded once: each k/n is recovered
    exactly from its float (n up to 2^20), so 57 of 60 positions is 0.95 itself and reaches a target of 0.95
    (a float mean of three 19/20 is 0.9499999999999998). Means over resamples (an interval's) are float means."""
    values = np.asarray(per_prompt, dtype=float)
    if values.ndim == 1 and len(values) and np.isfinite(values).all():
        exact = sum((Fraction(float(v)).limit_denominator(1 << 20) for v in values), Fraction(0))
        return float(exact / len(values))
    out = values.mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def mean_interval(values, rng: np.random.Generator, n_boot: int, level: float) -> tuple[float, float]:
    """The percentile interval at ``level`` of ``mean_agreement`` (a mean over units: prompts, problems) on
    ``n_boot`` resamples of the units with replacement, drawn from ``rng``: agreement's interval and a task's."""
    values = np.asarray(values, dtype=float)
    boot = mean_agreement(values[rng.integers(0, len(values), size=(n_boot, len(values)))])
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [tail, 1.0 - tail])
    return float(lo), float(hi)


def task_intervals(scores, scores_full, trial_id: str, n_boot: int, seed: int, level: float = 0.95) -> dict:
    """A task row's intervals (``sweep.tasks.evaluate`` gives the per-problem scores): accuracy's and
    accuracy_loss's (full minus gated per problem), problems resampled, each from a stream fixed by the trial and
    ``seed`` (the same trial always gets the same intervals). Null without problems."""
    gated = np.asarray(scores, dtype=float)
    loss = np.asarray(scores_full, dtype=float) - gated
    digest = int.from_bytes(hashlib.sha256(f"{trial_id}:{seed}:task".encode()).digest()[:8], "little")
    out = {}
    for name, values in (("accuracy", gated), ("accuracy_loss", loss)):
        lo = hi = None
        if len(values):  # each interval from a fresh generator on the trial's stream
            lo, hi = mean_interval(values, np.random.default_rng(digest), n_boot, level)
        out |= {f"{name}_lo": lo, f"{name}_hi": hi}
    return out


def skips_compute(mode, step_layers_saved, exit_rate, kv_policy) -> np.ndarray | bool:
    """True where a trial skipped decoder-layer work on decode steps: self-speculation (drafts run
    fewer layers), or early exit whose decode steps skipped layers (``step_layers_saved`` > 0; older
    rows without it: ``exit_rate`` > 0) under a K/V policy that does not run them anyway (not
    ``full``). Scalars or arrays (None: an older row's missing value)."""
    mode, kv = (np.asarray(v, dtype=object) for v in (mode, kv_policy))
    saved, rate = _floats(step_layers_saved), _floats(exit_rate)
    saved = np.nan_to_num(np.where(np.isnan(saved), rate, saved), nan=0.0)
    out = (mode == "self_speculative") | ((saved > 0) & (kv != None) & (kv != "full"))  # noqa: E711 (elementwise)
    return bool(out) if np.ndim(out) == 0 else out


def _floats(values) -> np.ndarray:
    """Floats with NaN for None (an older row's missing value)."""
    arr = np.asarray(values, dtype=object)
    return np.where(arr == None, np.nan, arr).astype(float)  # noqa: E711 (elementwise)


def inside_floor(value, floor) -> np.ndarray | bool:
    """True where ``value`` lies inside the noise floor ``floor`` (the fraction f of ``noise_floor``):
    within [1/(1+f), 1+f] it cannot be told from 1.0. False where no floor applies (None or NaN)."""
    v, f = np.asarray(value, dtype=float), _floats(floor)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.isfinite(f) & (np.abs(np.log(v)) <= np.log1p(np.nan_to_num(f, nan=0.0)))
    return bool(out) if np.ndim(out) == 0 else out


def ranked_speedup(measured, skipped, floor=None) -> np.ndarray | float:
    """The speedup a trial is ranked by: the measured ratio, capped at 1.0 from above where the trial
    skipped no compute (above 1.0 its ratio is timing noise; below, its probes and heads are a real
    cost and stay), then 1.0 where it lies inside the trial's noise floor ``floor`` (``inside_floor``).
    ``floor`` None or NaN: no floor applies (a row without an A/A control)."""
    m = np.asarray(measured, dtype=float)
    capped = np.where(np.asarray(skipped, dtype=bool), m, np.minimum(m, 1.0))
    out = np.where(inside_floor(capped, floor), 1.0, capped)
    return float(out) if np.ndim(out) == 0 else out


def row_speedup(row: Mapping[str, Any], metric: str = "speedup_wall") -> float | None:
    """A trial row's ranked speedup: ``ranked_speedup`` of its measured ``metric``, whether it skipped
    compute (``skips_compute``) and its A/A floor for that metric (``FLOOR_OF``). What the analysis
    ranks by (``sweep.analysis.ranked``) and what the Optuna study optimises (``sweep.orchestrate.report``); None
    without the measured value."""
    if row.get(metric) is None:
        return None
    skipped = skips_compute(row.get("mode"), row.get("step_layers_saved"), row.get("exit_rate"), row.get("kv_policy"))
    return ranked_speedup(row[metric], skipped, row.get(FLOOR_OF[metric]))


@dataclass
class Timings:
    """Seconds per side, [round][unit]: a unit is one prompt, or one batch of prompts decoded
    together. Prefill covers the request before the first decode step: prefill, the gate's
    calibration and the first token's decision; decode covers tokens 2..n. ``aa_*``: the A/A
    control, a second full-depth run of every unit in the same rounds (empty when not measured)."""

    base_decode: list[list[float]]
    gated_decode: list[list[float]]
    base_prefill: list[list[float]]
    gated_prefill: list[list[float]]
    aa_decode: list[list[float]] = field(default_factory=list)
    aa_prefill: list[list[float]] = field(default_factory=list)

    @classmethod
    def empty(cls, repeats: int, units: int) -> "Timings":
        return cls(*([[0.0] * units for _ in range(repeats)] for _ in range(6)))

    def speedup(self) -> float:
        """speedup_wall: decode only."""
        return pooled_speedup(self.base_decode, self.gated_decode)

    def speedup_e2e(self) -> float:
        """speedup_e2e_wall: whole requests, prefill and calibration included."""
        return pooled_speedup(
            np.add(self.base_decode, self.base_prefill), np.add(self.gated_decode, self.gated_prefill)
        )

    def aa(self) -> dict[str, float | None]:
        """The A/A control's figures: speedup_aa and speedup_e2e_aa (the bench's estimator, full depth
        against full depth) and each one's noise floor; None where no A/A was timed."""
        if not self.aa_decode:
            return {"speedup_aa": None, "speedup_e2e_aa": None, "noise_floor": None, "noise_floor_e2e": None}
        base_e2e, aa_e2e = np.add(self.base_decode, self.base_prefill), np.add(self.aa_decode, self.aa_prefill)
        return {
            "speedup_aa": pooled_speedup(self.base_decode, self.aa_decode),
            "speedup_e2e_aa": pooled_speedup(base_e2e, aa_e2e),
            "noise_floor": noise_floor(self.base_decode, self.aa_decode),
            "noise_floor_e2e": noise_floor(base_e2e, aa_e2e),
        }

    def columns(self) -> dict[str, list[list[float]] | None]:
        """The trial table's round_* columns, in ms."""

        def ms(m):
            return [[v * 1000 for v in row] for row in m] if m else None

        return {
            "round_baseline_ms": ms(self.base_decode),
            "round_ms": ms(self.gated_decode),
            "round_baseline_prefill_ms": ms(self.base_prefill),
            "round_prefill_ms": ms(self.gated_prefill),
            "round_aa_ms": ms(self.aa_decode),
            "round_aa_prefill_ms": ms(self.aa_prefill),
        }
