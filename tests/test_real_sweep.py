"""A small real sweep of the packaged SmolLM2-135M on the embedded Ray (slow)."""

from __future__ import annotations

import pytest

from conftest import sweep
from sweep.store import read

pytestmark = pytest.mark.slow


def test_small_grid_on_the_real_model(ray_session, tmp_path):
    outcome = sweep(
        tmp_path,
        "model=smollm2-135m",
        "search=saturation-grid",
        "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, 0.3)', gate.min_depth: 0.5}]",
        "bench.gen_tokens=8",
    )
    df = read("trials", tmp_path)
    assert len(outcome.rows) == 2 and df.height == 2
    assert set(df["status"]) == {"ok"} and set(df["model"]) == {"smollm2-135m"}
    assert set(df["min_layer"]) == {15} and set(df["num_layers"]) == {30}
    assert df["worker_model_loads"].max() == 1
    assert df["model_hash"].str.starts_with("sha256:").all()
    # SmolLM2 solves no HumanEval problem: the end names the run that measures an accuracy cost
    from conftest import compose
    from sweep.report.run_report import sweep_report

    text = " ".join(sweep_report(outcome, compose().analysis).split())
    assert "`sweep run experiment=qwen-coder eval.allow_code_execution=true`" in text
