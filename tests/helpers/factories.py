"""Factories several test files share: a trials row with every column filled, a cost model of round figures, and
a row as the verdicts read it."""

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


def full_trial_row(tid: str, status: str = "ok", run_id: str = "r1") -> dict:
    """A trials row with every column of the schema filled (model ``m``, gate ``saturation``)."""
    from sweep.store import TABLES

    row = {c.name: _dummy(c.dtype) for c in TABLES["trials"].columns}
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
