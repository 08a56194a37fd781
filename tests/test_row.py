"""A trial's row as one typed value: every column of the trials table, declared once in its part, checked when the
row is built; what a worker reports and the writer stores, across Ray as itself (never JSON text)."""

from __future__ import annotations

import pickle

import pytest

from conftest import compose
from sweep.store import TABLES, TRIAL_PARTS, TrialRow


@pytest.fixture(scope="module")
def row():
    from sweep.bench.command import run_bench

    cfg = compose("model=tiny-llama", "gate=margin", "gate.theta=1", "prompts.n=2", "bench.gen_tokens=4")
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        from dataclasses import replace

        _, full, _ = run_bench(replace(cfg, results=replace(cfg.results, root=root)))
    return full


def test_the_trials_table_is_its_parts_columns_each_declared_once():
    names = [c.name for part in TRIAL_PARTS.values() for c in part]
    assert names == [c.name for c in TABLES["trials"].columns] and len(set(names)) == len(names)


def test_a_row_is_every_column_checked_when_it_is_built(row):
    assert isinstance(row, TrialRow) and row["status"] == "ok" and row["trial_id"]
    assert list(row) == [c.name for c in TABLES["trials"].columns if c.name not in ("schema_version", "created_at")]
    assert row.part("agreement")["agreement"] == row["agreement"] and set(row.part("task")) <= set(row)
    values = dict(row)
    with pytest.raises(TypeError, match="missing \\['agreement'\\]"):
        TrialRow({k: v for k, v in values.items() if k != "agreement"})
    with pytest.raises(TypeError, match="unknown \\['agreemnt'\\]"):
        TrialRow({**values, "agreemnt": 1.0})
    with pytest.raises(TypeError, match="given twice: status"):
        TrialRow(values, {"status": "ok"})
    with pytest.raises(TypeError, match="may not be null are: status"):
        TrialRow({**values, "status": None})
    assert row.replace(status="failed")["status"] == "failed" and row["status"] == "ok"


def test_a_row_crosses_a_process_boundary_as_itself(row):
    """What Ray pickles: the typed row, its datetimes and lists as they are, not text to parse back."""
    back = pickle.loads(pickle.dumps(row))
    assert isinstance(back, TrialRow) and back == row and back["prompt_agreement"] == row["prompt_agreement"]
