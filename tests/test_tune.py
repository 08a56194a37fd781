"""`sweep run` on a real embedded Ray: grids, Optuna, one model load per worker, rows,
re-runs, resource checks, failed trials."""

from __future__ import annotations


import polars as pl
import pytest

from conftest import TINY_SWEEP, compose, run_cli, sweep
from sweep.errors import ConfigError
from sweep.config.identity import id_of_key
from sweep.store import files, read


def test_grid_sweep_writes_one_row_per_trial(ray_session, tmp_path):
    outcome = sweep(tmp_path, "search=saturation-grid")
    assert outcome.total == 8 and len(outcome.rows) == 8 and not outcome.interrupted
    df = read("trials", tmp_path)
    assert df.height == 8 and df["trial_id"].n_unique() == 8
    assert [id_of_key(key) for key in df["trial_key"]] == df["trial_id"].to_list()  # each id traces to its config
    assert df["status"].unique().to_list() == ["ok"]
    assert sorted(df["eps"].unique().to_list()) == [0.05, 0.1, 0.2, 0.3]
    assert df["sweep_name"].unique().to_list() == [outcome.name]
    assert df["min_depth"].unique().sort().to_list() == [0.25, 0.5]
    # one model load per worker process, however many trials it ran
    per_worker = df.group_by("worker_pid").agg(
        pl.len().alias("trials"), pl.col("worker_model_loads").max().alias("loads")
    )
    assert per_worker["loads"].to_list() == [1] * per_worker.height
    assert per_worker["trials"].sum() == 8 and per_worker["trials"].max() > 1


def test_rerun_skips_trials_whose_rows_exist(ray_session, tmp_path):
    sweep(tmp_path, "search=margin-grid")
    before = {p.name: p.stat().st_mtime_ns for p in files("trials", tmp_path)}
    again = sweep(tmp_path, "search=margin-grid")
    assert again.skipped == 6 and again.written == 0
    assert {r["trial_id"] for r in again.rows} == {p.stem for p in files("trials", tmp_path)}  # shown, not redone
    assert {p.name: p.stat().st_mtime_ns for p in files("trials", tmp_path)} == before
    redo = sweep(tmp_path, "search=margin-grid", "sweep.rerun=true")
    assert len(redo.rows) == 6 and len(files("trials", tmp_path)) == 6  # rewritten, not duplicated


def test_optuna_multi_objective_persists_its_study(ray_session, tmp_path):
    import optuna

    outcome = sweep(tmp_path, "search=optuna-mo", "search.n_trials=6")
    df = read("trials", tmp_path)
    assert df.height == 6 and set(df["gate"]) <= {"saturation", "margin"}
    study = optuna.load_study(study_name="optuna-mo", storage=f"sqlite:///{outcome.path}/optuna.db")
    assert len(study.directions) == 2
    assert len(study.trials) == 6
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    # the objective is the cost model's speedup of each trial's own exits; the measured ratio a user attribute
    assert {round(t.values[0], 9) for t in study.trials} == {round(v, 9) for v in df["speedup_model"]}
    assert {round(t.user_attrs["speedup_wall_measured"], 9) for t in study.trials} == {
        round(v, 9) for v in df["speedup_wall"]
    }


def test_optuna_is_seeded(ray_session, tmp_path):
    first = sweep(tmp_path / "a", "search=optuna-mo", "search.n_trials=3", "sweep.max_concurrent=1")
    second = sweep(tmp_path / "b", "search=optuna-mo", "search.n_trials=3", "sweep.max_concurrent=1")
    key = lambda rows: [(r["gate"], r["eps"], r["theta"], r["min_layer"]) for r in rows]  # noqa: E731
    assert key(first.rows) == key(second.rows)


def test_constrained_search_hands_agreement_to_the_sampler(ray_session, tmp_path):
    import optuna

    outcome = sweep(tmp_path, "search=optuna-constrained", "search.n_trials=3")
    study = optuna.load_study(
        study_name="optuna-constrained",
        storage=f"sqlite:///{outcome.path}/optuna.db",
    )
    assert len(study.directions) == 1
    rows = {r["trial_id"]: r for r in read("trials", tmp_path).to_dicts()}
    for trial in study.trials:
        row = rows[trial.user_attrs["trial_id"]]
        assert trial.user_attrs["agreement"] == pytest.approx(row["agreement"])
        # Optuna's list format: what optuna-dashboard reads, and what Optuna's samplers read as trial.constraints;
        # the last one: a trial that skipped no compute is infeasible
        skip = 0.0 if trial.user_attrs["skipped_compute"] else 1.0
        assert trial.system_attrs["constraints"] == [pytest.approx(0.98 - row["agreement"]), skip]
        assert trial.constraints == {"0": pytest.approx(0.98 - row["agreement"]), "1": skip}


def test_failed_trials_are_rows(ray_session, tmp_path):
    """A setting that fails in its worker (what the model cannot do is known once it loads: a layer past its depth
    is refused before Ray starts, tests/test_checked_first.py) is a failed row beside the others."""
    outcome = sweep(
        tmp_path,
        "search=saturation-grid",
        "model=tiny-mamba",
        "search.spaces=[{gate: saturation, gate.eps: 0.1, bench.kv_policy: 'choice(full, propagate)'}]",
    )
    df = read("trials", tmp_path).sort("kv_policy")
    # bundled by default (sweep.shared_baseline): the setting that cannot run fails alone
    assert df["status"].to_list() == ["ok", "failed"]
    assert df["baseline_shared"][0] == 1
    assert "bench.kv_policy=propagate: refused for model=tiny-mamba" in df["error"][1]
    assert df["agreement"][1] is None and df["model_hash"][1] == "unknown"
    assert len(outcome.rows) == 2


def test_gpu_request_on_a_cpu_cluster_fails_fast(ray_session, tmp_path):
    """Refused before anything is scheduled (a trial asking for a GPU no node has would stay PENDING forever)."""
    with pytest.raises(ConfigError, match=r"resources.gpu=1.0: no node of this cluster has 1 GPU\(s\)"):
        sweep(tmp_path, "resources.gpu=1")
    with pytest.raises(ConfigError, match="resources.cpu=64: no node of this cluster has that many CPUs"):
        sweep(tmp_path, "resources.cpu=64")
    with pytest.raises(ConfigError, match="device=cuda: this sweep gives trials no GPU") as refused:
        sweep(tmp_path, "device=cuda", "resources.gpu=0")
    assert "(resources.gpu=0);" in str(refused.value)  # the value given (before: "and the cluster has none")
    with pytest.raises(ConfigError, match=r"no GPU \(resources.gpu=auto, and no node of this cluster has a GPU\)"):
        sweep(tmp_path, "device=cuda")  # auto, the default: not "resources.gpu=0", which the user did not set
    assert not (tmp_path / "trials").exists()


def test_bad_trial_values_fail_before_ray_runs_anything(ray_session, tmp_path):
    with pytest.raises(ConfigError, match=r"gate\.eps=-1(\.0)?: must be a number > 0"):
        sweep(tmp_path, "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, -1)'}]")
    with pytest.raises(ConfigError, match=r"gate.q=1.5: must be a number in \(0, 1\]"):  # an Optuna interval's far end
        sweep(tmp_path, "search=optuna-mo", "search.spaces=[{gate: conformal, gate.q: 'interval(0.5, 1.5)'}]")
    assert not (tmp_path / "trials").exists() and not (tmp_path / "ray").exists()


def test_duplicate_grid_points_run_once(ray_session, tmp_path):
    outcome = sweep(
        tmp_path, "search.spaces=[{gate: saturation, gate.eps: 'choice(0.1, 0.1)'}, {gate: saturation, gate.eps: 0.1}]"
    )
    assert outcome.total == 1 and len(outcome.rows) == 1 and not outcome.interrupted


def test_auto_gpu_is_none_for_cpu_trials(ray_session):
    assert ray_session.trial_resources(compose("device=cpu"))["gpu"] == 0.0


@pytest.mark.ray
def test_cli_gpu_request_fails_on_its_own_embedded_ray(tmp_path):
    res = run_cli("run", *TINY_SWEEP, "resources.gpu=1", f"results.root={tmp_path}", timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "resources.gpu=1.0: no node of this cluster has 1 GPU(s)" in errors[0]


@pytest.mark.ray
def test_cli_advertised_gpu_without_cuda_is_refused_before_any_trial(tmp_path):
    """A Ray node that advertises a GPU (here `cluster.num_gpus=1` on a machine whose torch sees none) would fail
    every trial, each with its row: asked once before them, one line, rc 2, nothing written."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA device here: the advertised GPU is real")
    res = run_cli("run", *TINY_SWEEP, "cluster.num_gpus=1", f"results.root={tmp_path}", timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "resources.gpu=auto: the cluster advertises GPUs" in errors[0], res.stderr
    assert "sees no CUDA device" in errors[0] and "use device=cpu" in errors[0]
    assert "failed" not in res.stderr and not (tmp_path / "trials").exists()


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_unreachable_cluster_address_fails_fast(tmp_path):
    res = run_cli(
        "run", *TINY_SWEEP, "cluster=existing", "cluster.address=127.0.0.1:9", f"results.root={tmp_path}", timeout=120
    )
    assert res.returncode == 2 and "cluster.address=127.0.0.1:9: nothing answers" in res.stderr


@pytest.mark.parametrize("auth, kind", [("token", "http"), ("disabled", "http"), ("token", "grpc")])
@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_cluster_address_of_something_else_fails_fast(tmp_path, auth, kind):
    """A port where a server that is not Ray's GCS answers (an HTTP server; a gRPC server without the GCS's service,
    as a raylet's or the Ray Client's port): ray.init would retry for minutes, a warning line every few seconds (for
    the gRPC server: 27 s and 20 lines of Ray's C++ client); refused in one line instead."""
    import concurrent.futures
    import http.server
    import threading

    import grpc

    if kind == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{server.server_address[1]}"
        stop = lambda: (server.shutdown(), server.server_close())  # noqa: E731
    else:
        rpc = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        address = f"127.0.0.1:{rpc.add_insecure_port('127.0.0.1:0')}"
        rpc.start()
        stop = lambda: rpc.stop(None)  # noqa: E731
    try:
        res = run_cli(
            "run", *TINY_SWEEP, "cluster=existing", f"cluster.auth={auth}", f"cluster.address={address}",
            f"results.root={tmp_path}", env={"RAY_AUTH_TOKEN": "0123456789abcdef0123456789abcdef"}, timeout=120,
        )  # fmt: skip
    finally:
        stop()
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"something answers at {address}, but not a Ray cluster's GCS" in errors[0]
    assert "Failed to connect to GCS" not in res.stderr and not (tmp_path / "trials").exists()
    assert "Failed to get cluster ID" not in res.stderr


@pytest.mark.ray
def test_run_prints_progress_table_and_front(tmp_path):
    res = run_cli("run", *TINY_SWEEP, "search=conformal-grid", f"results.root={tmp_path}", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sweep: [6/6] tiny-llama gate=conformal" in res.stderr
    assert "Pareto front" in res.stdout and "orchestration overhead per Tune trial" in res.stdout
    assert f"rows: {tmp_path}/trials" in res.stdout
    assert read("trials", tmp_path).height == 6
