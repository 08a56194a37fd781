"""Factories several test files share: trial rows from (speedup, agreement) points, a row of any table with every
column filled (a trials row), a timed row of given round timings, a cost model of round figures, a row as the
verdicts read it, and a screen's simulated rows."""

from __future__ import annotations

from datetime import datetime, timezone

import polars as pl

from sweep.bench.costs import CostModel


def _dummy(dtype: pl.DataType):
    """A value of ``dtype`` (every column filled, so the store accepts the row)."""
    if isinstance(dtype, pl.List):
        return [_dummy(dtype.inner)]
    if isinstance(dtype, pl.Datetime):
        return datetime.now(timezone.utc)
    return {pl.Boolean: True, pl.String: "x", pl.Float64: 1.0, pl.Int32: 1, pl.Int64: 1}[dtype.base_type()]


def full_row(table: str) -> dict:
    """A row of results table ``table`` with every column of the schema filled."""
    from sweep.store import TABLES

    return {c.name: _dummy(c.dtype) for c in TABLES[table].columns}


def full_trial_row(tid: str, status: str = "ok", run_id: str = "r1") -> dict:
    """A trials row with every column of the schema filled (model ``m``, gate ``saturation``)."""
    row = full_row("trials")
    row.update(trial_id=tid, status=status, run_id=run_id, model="m", gate="saturation", schema_version=3)
    return row


def cost_model(num_layers: int = 4, **kw) -> CostModel:
    """A cost model of round figures (a layer 1 ms, the head 2 ms, a step 6.5 ms), ``kw`` replacing any."""
    base = dict(
        layer_ms=1.0,
        head_ms=2.0,
        lens_probe_ms=2.5,
        hidden_probe_ms=0.1,
        kv_ms=0.2,
        overhead_ms=0.5,
        step_ms=6.5,
        num_layers=num_layers,
        prefill_ms=100.0,
        prefill_lens_ms=5.0,
        prompt_tokens=10,
    )
    return CostModel(**{**base, **kw})


def verdict_row(**kw) -> dict:
    """A ranked row as the verdicts read it (a self-speculative fixed exit by default), ``kw`` replacing any."""
    row = {
        "trial_id": "t1",
        "speedup_metric": "speedup_wall",
        "gate": "fixed",
        "params": "exit_layer=20 mode=self_speculative draft_len=4",
        "mode": "self_speculative",
        "exit_rate": 0.0,
        "acceptance_rate": 0.8,
        "skipped_compute": True,
        "capped": False,
        "within_noise": False,
        "speedup_floor": 0.03,
        "speedup_noise": None,
        "ci_prompts": 8,
        "ci_few_prompts": False,
    }
    row.update(kw)
    row.setdefault("speedup_wall", row.get("speedup"))
    return row


def timed_row(
    trial_id, base, gated, *, agree=None, exit_rate=0.5, kv_policy="propagate", mode="early_exit", speedup=None, **extra
):
    """One ok trial row from [round][prompt] decode ms; speedup_wall by the bench's definition,
    computed here by hand: the median over rounds of summed baseline / summed gated."""
    ratios = sorted(sum(b) / sum(g) for b, g in zip(base, gated))
    mid = len(ratios) // 2
    point = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    n = len(base[0])
    return {
        "trial_id": trial_id,
        "model": "m",
        "gate": "saturation",
        "status": "ok",
        "eps": 0.1,
        "min_layer": 2,
        "exit_rate": exit_rate,
        "step_layers_saved": exit_rate * 0.5,
        "kv_policy": kv_policy,
        "mode": mode,
        "speedup_wall": point if speedup is None else speedup,
        "agreement": 1.0 if agree is None else sum(agree) / len(agree),
        "prompt_agreement": [1.0] * n if agree is None else agree,
        "round_baseline_ms": base,
        "round_ms": gated,
        "round_baseline_prefill_ms": [[0.0] * n for _ in base],
        "round_prefill_ms": [[0.0] * n for _ in base],
        **extra,
    }


def trials(points, *, model="m", gate="saturation", status="ok", start=0):
    """Trial rows from (speedup_wall, agreement) points; trial ids t000, t001, ..."""
    return pl.DataFrame(
        {
            "trial_id": [f"t{start + i:03d}" for i in range(len(points))],
            "model": [model] * len(points),
            "gate": [gate] * len(points),
            "status": [status] * len(points),
            "speedup_wall": [float(p[0]) for p in points],
            "agreement": [float(p[1]) for p in points],
            "eps": [0.1] * len(points),
            "min_layer": [8] * len(points),
            "exit_rate": [0.5] * len(points),
            "step_layers_saved": [0.3] * len(points),
            "kv_policy": ["propagate"] * len(points),
            "mode": ["early_exit"] * len(points),
        }
    )


def aa_row(tid: str, base, aa, repeats: int | None = None, *, prefill=None, aa_prefill=None) -> dict:
    """An ok trial row with its A/A control's rounds ([round][unit] ms), prefill 0 unless given; ``repeats``: its
    rounds unless given."""
    zeros = [[0.0] * len(base[0]) for _ in base]
    return {
        "trial_id": tid,
        "model": "m",
        "status": "ok",
        "round_baseline_ms": base,
        "round_aa_ms": aa,
        "round_baseline_prefill_ms": prefill or zeros,
        "round_aa_prefill_ms": aa_prefill or zeros,
        "repeats": len(base) if repeats is None else repeats,
        "noise_floor": 0.05,
        "noise_floor_e2e": 0.05,
    }


def simulated_rows(selected: list[bool]) -> pl.DataFrame:
    """Simulated rows of margin settings t0, t1, ... (agreement_tf 0.9, speedup_model 1.5), ``selected`` as given."""
    from sweep.gates import GATE_COLUMNS

    n = len(selected)
    cols = {c: [None] * n for c in GATE_COLUMNS}
    cols["theta"] = [float(i + 1) for i in range(n)]
    return pl.DataFrame(
        {"trial_id": [f"t{i}" for i in range(n)], "gate": ["margin"] * n, "min_layer": [2] * n, **cols,
         "agreement_tf": [0.9] * n, "speedup_model": [1.5] * n, "selected": selected},
        schema_overrides={c: pl.Float64 for c in ("eps", "theta", "q", "decay")},
    )  # fmt: skip
