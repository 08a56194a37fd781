"""No work wasted (issue 46): what can fail is checked before the timed rounds, so a computed row is never lost to an
input that could have been checked first. Real files, real processes, tiny models.

- a cost-model cache entry whose figures are not a measurement's (zero, negative, a string, a list, NaN) is
  measured over with a warning, before the timed rounds, and the row lands;
- a harness task's data file that is missing is one line (rc 2) before any model loads;
- the paths a user names are read once (``~`` and variables expanded, resolved) and that is what every command
  checks and writes: ``~/R`` lands under $HOME, a root that is a symbolic link works in bench, run and analyze, a
  link planted at ``trials/kept`` is refused before the work;
- a setting stopped under one sweep's stopping rule is measured by a sweep under another; a kept row is replaced
  only under the rules of a row in place; a sweep's definition is written once its work starts;
- self-speculation needs no ``bench.kv_policy`` on state-space families.
"""

from __future__ import annotations

import json
import logging
import math

import pytest

from conftest import compose, run_cli
from helpers.contract import chat_prompts

pytestmark = pytest.mark.faults

BENCH = ("model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")


# ------------------------------------------------------------------ 1. cost-model cache entries


@pytest.fixture(scope="module")
def measured_entry(tmp_path_factory):
    """A real cost-model cache entry of tiny-llama (measured once), its key, its model's depth and prompt length."""
    import os

    from sweep.bench.costs import cost_model
    from sweep.models import load_model

    cache = tmp_path_factory.mktemp("costs-cache")
    before = os.environ.get("SWEEP_CACHE_DIR")
    os.environ["SWEEP_CACHE_DIR"] = str(cache)
    try:
        cfg = compose("model=tiny-llama")
        lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        prompt = chat_prompts(lm, 1)[0].input_ids
        cost_model(lm, prompt, kv_policies=["propagate"], verify_positions=2)
    finally:
        os.environ.pop("SWEEP_CACHE_DIR") if before is None else os.environ.update(SWEEP_CACHE_DIR=before)
    [path] = (cache / "costs").glob("*.json")
    data = json.loads(path.read_text())
    return data, lm.num_layers, len(prompt)


POSITIVE = ["layer_ms", "head_ms", "step_ms", "num_layers", "prompt_tokens"]
NON_NEGATIVE = ["kv_ms", "lens_probe_ms", "overhead_ms", "prefill_ms", "attn_ms"]


@pytest.mark.parametrize(
    ("field", "value"),
    [(f, v) for f in POSITIVE for v in (0, -1, "x", [1], math.nan, True)]
    + [(f, v) for f in NON_NEGATIVE for v in (-1, "x", [1], math.inf)]
    + [("verify_ms", v) for v in (0, [0], [-1.0], ["x"], {"a": 1})]
    + [("extra_probe_ms", v) for v in (0, [1], {"margin/lens": -1}, {"margin/lens": "x"})]
    + [("num_layers", 3), ("prompt_tokens", 1000)],  # another model's depth, another prompt's length
)
def test_a_cache_entry_with_a_figure_no_measurement_gives_is_measured_over(
    tmp_path, caplog, measured_entry, field, value
):
    from sweep.bench import costs_cache

    data, layers, tokens = measured_entry
    path = tmp_path / "entry.json"
    path.write_text(json.dumps({**data, "costs": {**data["costs"], field: value}}))
    with caplog.at_level(logging.WARNING, logger="sweep.bench.costs_cache"):
        assert costs_cache.load(path, data["key"], layers) is None
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"cost model cache {path}: not used (") and field in said and "\n" not in said


def test_the_measured_entry_itself_is_taken(tmp_path, measured_entry):
    from sweep.bench import costs_cache

    data, layers, tokens = measured_entry
    path = tmp_path / "entry.json"
    path.write_text(json.dumps(data))
    costs = costs_cache.load(path, data["key"], layers)
    assert costs is not None and costs.layer_ms == data["costs"]["layer_ms"] and costs.prompt_tokens == tokens


@pytest.mark.parametrize("field, value", [("layer_ms", 0), ("kv_ms", "x"), ("verify_ms", [-1])])
def test_a_bench_on_a_planted_cache_entry_measures_it_over_and_keeps_its_row(tmp_path, field, value):
    """Without the check, each of these failed after the timed rounds (ZeroDivisionError, TypeError) and the row was
    lost; now the entry is measured over before them, said in one warning, and the bench ends ok with its row."""
    from sweep.store import read

    env = {"SWEEP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    args = ["bench", *BENCH, "gate=saturation", "gate.eps=0.3", "gate.min_layer=1"]
    first = run_cli(*args, f"results.root={tmp_path / 'a'}", env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    [entry] = (tmp_path / "cache" / "costs").glob("*.json")
    data = json.loads(entry.read_text())
    data["costs"][field] = value
    entry.write_text(json.dumps(data))
    again = run_cli(*args, f"results.root={tmp_path / 'b'}", env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"cost model cache {entry}: not used ({field}" in again.stderr.replace("\n         ", " ")
    row = read("trials", tmp_path / "b").row(0, named=True)
    assert row["status"] == "ok" and row["cost_model_source"] == "fresh" and row["cost_layer_ms"] > 0
