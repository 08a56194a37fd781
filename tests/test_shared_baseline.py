"""`sweep.shared_baseline`: grid settings of one model bundled into one Tune trial, timed
against one full-depth baseline per round, each still its own row under its own trial id."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY_SWEEP, compose, sweep
from sweep.errors import ConfigError
from sweep.orchestrate.plan import baseline_groups, plan_sweep, select_trials
from sweep.store import files, read

SPACE = "search.spaces=[{{gate: {gates}, bench.kv_policy: 'choice(full, propagate)', {extra}}}]"


def _groups(tmp_path, size, *extra):
    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=saturation-grid", *extra]
    p = plan_sweep(compose(*args), args)
    todo, _ = select_trials(p.grid_trials, {}, "cpu", str(tmp_path))
    return p, baseline_groups(p.grid_trials, todo, size)


def test_bundles_hold_settings_that_differ_only_in_gate_kv_policy_and_mode(tmp_path):
    p, groups = _groups(tmp_path, 16)
    assert [len(g) for g in groups] == [8]  # the saturation grid: eps x min_depth, one model and bench
    _, groups = _groups(tmp_path, 3)
    assert [len(g) for g in groups] == [3, 3, 2]  # at most the bundle size, in planned order
    assert [t for g in groups for t in g] == [t for t, _ in p.grid_trials]
    # settings that need another baseline (prompts, tokens) never share one
    space = SPACE.format(gates="saturation", extra="bench.gen_tokens: 'choice(3, 4)', prompts.n: 'choice(1, 2)'")
    p, groups = _groups(tmp_path, 16, space)
    cfgs = {tuple(t): c for t, c in p.grid_trials}
    assert len(p.grid_trials) == 8 and [len(g) for g in groups] == [2, 2, 2, 2]
    for group in groups:
        members = [cfgs[tuple(t)] for t in group]
        assert len({(c.bench.gen_tokens, c.prompts.n) for c in members}) == 1
        assert {c.bench.kv_policy for c in members} == {"full", "propagate"}


def test_shared_baseline_is_a_bounded_integer():
    with pytest.raises(ConfigError, match=r"sweep.shared_baseline=0: must be an integer in 1\.\.16"):
        compose("sweep.shared_baseline=0")
    assert compose().sweep.shared_baseline == 4  # measured within noise of one-setting trials (README)


# saturation settings that exit on tiny-llama, under both KV policies: 8 settings of one model
EXITING = SPACE.format(gates="saturation", extra="gate.min_layer: 2, gate.eps: 'choice(0.3, 0.6, 0.8, 0.95)'")


def test_a_bundled_sweep_writes_the_same_trials_with_the_same_tokens(ray_session, tmp_path):
    """Bundled and one-setting sweeps of one grid: the same trial ids, and each setting's
    agreement and exit figures equal (its tokens do not depend on who shares its baseline)."""
    one = sweep(tmp_path / "one", "search=saturation-grid", EXITING, "sweep.shared_baseline=1")
    shared = sweep(tmp_path / "shared", "search=saturation-grid", EXITING, "sweep.shared_baseline=4")
    assert shared.total == 8 and shared.written == 8 and not shared.interrupted
    a = read("trials", tmp_path / "one").sort("trial_id")
    b = read("trials", tmp_path / "shared").sort("trial_id")
    assert a["trial_id"].to_list() == b["trial_id"].to_list()
    assert b["status"].unique().to_list() == ["ok"]
    assert a["baseline_shared"].unique().to_list() == [1] and b["baseline_shared"].unique().to_list() == [4]
    for col in ("agreement", "exit_rate", "mean_exit_layer", "layers_saved"):
        assert a[col].to_list() == b[col].to_list(), col
    assert b["exit_rate"].max() > 0  # some settings exit, so equal figures are not all zeros
    # two Tune trials (bundles of 4), one row file per setting
    trial_dirs = [d for d in Path(shared.path).iterdir() if d.name.startswith("trial_")]
    assert len(trial_dirs) == 2 and len(files("trials", tmp_path / "shared")) == 8
    assert len(shared.overhead_s) == 2  # the driver's overhead is per Tune trial, not per row
    assert one.written == 8 and len(one.overhead_s) == 8


def test_a_bundle_of_the_trials_left_runs_after_some_rows_exist(ray_session, tmp_path):
    sweep(tmp_path, "search=saturation-grid", "sweep.shared_baseline=4")
    victims = sorted(files("trials", tmp_path))[:3]
    for path in victims:
        path.unlink()
    again = sweep(tmp_path, "search=saturation-grid", "sweep.shared_baseline=4")
    assert (again.written, again.skipped) == (3, 5) and not again.interrupted
    df = read("trials", tmp_path)
    assert df.height == 8 and df["trial_id"].n_unique() == 8
    assert sorted(df["baseline_shared"].to_list()) == [3, 3, 3, 4, 4, 4, 4, 4]


def test_a_bundle_given_up_on_writes_a_failed_row_per_setting(tmp_path):
    from sweep.orchestrate.writer import RowWriter

    p, groups = _groups(tmp_path, 4)
    writer = RowWriter(str(p.root), 8, p.base, p.run_id, p.name, "cpu")
    writer.errored({"trials": groups[0]}, "the worker died")
    df = read("trials", tmp_path)
    assert df.height == 4 and df["status"].unique().to_list() == ["failed"]
    assert all("the worker died" in e for e in df["error"])
