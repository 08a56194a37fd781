"""Planning a sweep without Ray: names, base overrides, values checked, trials selected; and
trial identity (sweep/config/identity.py): one key and id, stored with the row, the same on the
planner and in the worker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import TINY_SWEEP, compose
from sweep.errors import ConfigError
from sweep.config.identity import id_of_key, trial_device, trial_identity
from sweep.orchestrate.plan import base_overrides, plan_sweep, select_trials, sweep_name
from sweep.orchestrate.settings import merge, trial_config


def plan(tmp_path, *overrides):
    args = [*TINY_SWEEP, f"results.root={tmp_path}", *overrides]
    return plan_sweep(compose(*args), args)


def test_planning_and_identity_import_without_ray_or_torch():
    code = (
        "import sys, sweep.config.identity; assert 'torch' not in sys.modules, 'identity imported torch'; "
        "import sweep.orchestrate.plan, sweep.orchestrate.writer, sweep.orchestrate.worker, sweep.orchestrate.submit; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_trial_overrides_replace_base_ones_and_the_driver_sets_its_own():
    merged = merge(["gate=margin", "+x=1", "prompts.n=2"], ["gate=saturation", "~x=2"])
    assert merged == ["prompts.n=2", "gate=saturation", "~x=2"]
    base = base_overrides(["resume=true", "sweep.name=s", "run_id=a", "results.root=r", "gate=margin"], "b", "/abs")
    assert base == ["gate=margin", "run_id=b", "results.root=/abs"]


def test_a_sweep_is_named_by_search_and_run_unless_resumed(tmp_path):
    assert sweep_name(compose("search=margin-grid"), tmp_path, "r1") == "margin-grid-r1"
    with pytest.raises(ConfigError, match="resume=true: no earlier sweep of search=margin-grid"):
        sweep_name(compose("search=margin-grid", "resume=true"), tmp_path, "r2")
    (tmp_path / "margin-grid-r1").mkdir()
    assert sweep_name(compose("search=margin-grid", "resume=true"), tmp_path, "r2") == "margin-grid-r1"
    with pytest.raises(ConfigError, match="sweep.name=other: no sweep of that name"):
        sweep_name(compose("sweep.name=other", "resume=true"), tmp_path, "r2")


def test_plan_checks_values_and_selects_each_trial_once(tmp_path):
    with pytest.raises(ConfigError, match=r"gate\.eps=-1(\.0)?: must be a number > 0"):
        plan(tmp_path, "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, -1)'}]")
    p = plan(tmp_path, "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, 0.1, 0.2)'}]")
    assert p.name.startswith("saturation-grid-") and p.path == tmp_path.resolve() / "ray" / p.name
    assert p.base[-2:] == [f"run_id={p.run_id}", f"results.root={tmp_path.resolve()}"] and p.done == {}
    todo, skipped = select_trials(p.grid_trials, {}, "cpu", str(tmp_path))
    assert (todo, skipped) == ([["gate=saturation", "gate.eps=0.1"], ["gate=saturation", "gate.eps=0.2"]], 0)
    done = {trial_identity(p.grid_trials[2][1], "cpu").id: {}}
    assert select_trials(p.grid_trials, done, "cpu", str(tmp_path)) == ([["gate=saturation", "gate.eps=0.1"]], 1)
    assert select_trials(p.grid_trials, done, "cuda", str(tmp_path))[1] == 0  # another device, another trial


@pytest.mark.parametrize("gpus", [0.0, 1.0])
def test_worker_and_planner_agree_for_device_auto(tmp_path, gpus):
    from sweep.bench.rows import trial_fields

    p = plan(tmp_path, "search=margin-grid", "device=auto")
    device = trial_device(p.cfg.device, gpus)  # the driver's, from the GPUs each trial gets
    assert device == ("cuda" if gpus else "cpu")
    rows = {}
    for trial, _ in p.grid_trials:
        worker_cfg = trial_config(p.base, trial, device)  # what the worker runs, on the driver's device
        row = trial_fields(worker_cfg, 1)  # the row's identity columns (bench.run_trial, failed rows)
        assert row["trial_id"] == trial_identity(worker_cfg, device).id  # the worker's lookup of done rows
        assert json.loads(row["trial_key"])["device"] == device  # not re-resolved where the worker runs
        rows[row["trial_id"]] = row
    assert select_trials(p.grid_trials, rows, device, str(tmp_path)) == ([], len(p.grid_trials))


def test_trial_key_is_canonical_json_of_the_defining_config():
    cfg = compose(*TINY_SWEEP, "gate=saturation", "gate.eps=0.2")
    ident = trial_identity(cfg, "cpu")
    key = json.loads(ident.key)
    assert set(key) == {"model", "gate", "bench", "prompts", "device", "dtype", "seed"}
    assert key["gate"]["eps"] == 0.2 and key["device"] == "cpu" and "cost_model" not in key["bench"]
    assert id_of_key(ident.key) == ident.id and len(ident.id) == 16
    elsewhere = compose(*TINY_SWEEP, "gate=saturation", "gate.eps=0.2", "run_id=x", "results.root=/e")
    assert trial_identity(elsewhere, "cpu") == ident  # not where it is written, not the run
    assert trial_identity(cfg, "cuda").id != ident.id
    with pytest.raises(ValueError, match="device must be one of"):
        trial_identity(cfg, "auto")


def test_a_stored_rows_key_rebuilds_its_id(tmp_path):
    from sweep.orchestrate.writer import RowWriter
    from sweep.store import read

    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=margin-grid"]
    p = plan_sweep(compose(*args), args)
    writer = RowWriter(str(p.root), 1, p.base, p.run_id, p.name, "cpu")
    writer.errored({"trial": p.grid_trials[0][0]}, "the worker died")
    row = read("trials", tmp_path).row(0, named=True)
    assert row["status"] == "failed" and row["trial_key"] is not None
    assert id_of_key(row["trial_key"]) == row["trial_id"]
    assert row["trial_id"] == trial_identity(p.grid_trials[0][1], "cpu").id  # the id the planner skips by


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_sweep_name_is_one_configuration(tmp_path):
    """The first run records what defines the sweep; a new run under the name is refused (resume=true continues
    it); a resume that changes the definition is refused naming what differs; raising search.n_trials is a resume
    that searches further."""
    from sweep.orchestrate.plan import DEFINITION, plan_sweep, record_definition

    base = ["model=tiny-llama", "search=optuna-mo", "search.n_trials=4", "prompts.n=2", f"results.root={tmp_path}"]
    first = plan_sweep(compose(*base, "sweep.name=s1"), [*base, "sweep.name=s1"])
    assert not (first.storage / "s1").exists()  # planned only: recorded once the sweep starts its work
    record_definition(first)
    assert (first.storage / "s1" / DEFINITION).is_file()
    with pytest.raises(ConfigError, match=r"sweep.name=s1: a sweep of that name exists .*; resume=true continues it"):
        plan_sweep(compose(*base, "sweep.name=s1"), [])
    resumed = [*base, "sweep.name=s1", "resume=true"]
    plan_sweep(compose(*resumed, "search.n_trials=8"), [])  # searching further: the same sweep
    with pytest.raises(
        ConfigError, match=r"differs from the sweep's definition in prompts.n \(prompts.n: 2 there, 3 here\)"
    ):
        plan_sweep(compose(*resumed, "prompts.n=3"), [])
    with pytest.raises(ConfigError, match=r"differs from the sweep's definition in bench.gen_tokens"):
        plan_sweep(compose(*resumed, "bench.gen_tokens=8"), [])
    with pytest.raises(ConfigError, match=r"differs from the sweep's definition in search.objectives"):
        plan_sweep(compose(*resumed, "search.objectives.agreement=min"), [])
