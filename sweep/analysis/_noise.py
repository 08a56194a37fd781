"""The A/A noise floor per model: every trial times full depth against full depth in its own rounds
(the A/A control); pooled over a model's trials, those rounds say how far a null effect wanders
and how many timed rounds bring that floor down to a target.

Each trial's own floor (``noise_floor``, from its rounds alone) is what its ranked speedup uses;
this summary pools every distinct A/A control of a model (a shared-baseline group's rows share
one), so its floor at the trials' number of rounds, and the rounds a target floor needs, rest on
all of them (``sweep.bench.noise.noise_floor`` and ``rounds_for_floor``).
"""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from sweep.bench.estimators import pooled_speedup
from sweep.bench.noise import noise_floor, rounds_for_floor

FLOOR_TARGET = 0.02  # analysis.floor_target's default: +-2%

_SCHEMA = {
    "model": pl.String,
    "aa_controls": pl.Int32,
    "aa_rounds": pl.Int32,
    "aa_median": pl.Float64,
    "aa_min": pl.Float64,
    "aa_max": pl.Float64,
    "repeats": pl.Int32,
    "floor": pl.Float64,
    "trial_floor_median": pl.Float64,
    "floor_target": pl.Float64,
    "rounds_for_target": pl.Int64,  # a projection: an offset just inside the target projects billions of rounds
}


def noise_floors(trials: pl.DataFrame, metric: str = "speedup_wall", target: float = FLOOR_TARGET) -> pl.DataFrame:
    """Per model with ok trials that timed an A/A control: how many distinct controls (``aa_controls``)
    and timed rounds (``aa_rounds``) there are; the median, least and greatest A/A speedup over the
    controls (``speedup_aa``'s estimator, or its end-to-end twin for speedup_e2e_wall); the floor
    pooled over every round at the trials' median ``repeats`` (``floor``) beside the median of the
    trials' own floors; and the rounds a floor of ``target`` needs, projected from the pooled floor
    (``rounds_for_target``: ``sweep.bench.noise.rounds_for_floor``; null when the A/A's offset alone reaches
    the target)."""
    e2e = metric == "speedup_e2e_wall"
    need = ["model", "status", "round_baseline_ms", "round_aa_ms", "repeats", "noise_floor", "noise_floor_e2e"]
    need += ["round_baseline_prefill_ms", "round_aa_prefill_ms"]
    if not set(need) <= set(trials.columns):
        return pl.DataFrame(schema=_SCHEMA)
    ok = trials.filter((pl.col("status") == "ok") & pl.col("round_aa_ms").is_not_null())
    rows = []
    for (model,), sub in sorted(ok.partition_by("model", as_dict=True).items()):
        controls = {}
        for r in sub.iter_rows(named=True):
            base, aa = np.asarray(r["round_baseline_ms"], float), np.asarray(r["round_aa_ms"], float)
            if e2e:
                base = base + np.asarray(r["round_baseline_prefill_ms"], float)
                aa = aa + np.asarray(r["round_aa_prefill_ms"], float)
            controls.setdefault((base.tobytes(), aa.tobytes()), (base, aa))  # a group's rows share one control
        # every round is one draw of the A/A noise: a round's units summed (trials may differ in units)
        sums = [(b.sum(axis=-1), a.sum(axis=-1)) for b, a in controls.values()]
        base = np.concatenate([b for b, _ in sums])[:, None]
        aa = np.concatenate([a for _, a in sums])[:, None]
        ratios = [pooled_speedup(b[:, None], a[:, None]) for b, a in sums]  # each control's speedup_aa
        repeats = int(statistics.median(sub["repeats"].to_list()))
        floors = sub["noise_floor_e2e" if e2e else "noise_floor"].drop_nulls().to_list()
        rows.append(
            {
                "model": model,
                "aa_controls": len(controls),
                "aa_rounds": base.shape[0],
                "aa_median": statistics.median(ratios),
                "aa_min": min(ratios),
                "aa_max": max(ratios),
                "repeats": repeats,
                "floor": noise_floor(base, aa, rounds=repeats),
                "trial_floor_median": statistics.median(floors) if floors else None,
                "floor_target": float(target),
                "rounds_for_target": rounds_for_floor(base, aa, target, rounds=repeats),
            }
        )
    return pl.DataFrame(rows, schema=_SCHEMA)
