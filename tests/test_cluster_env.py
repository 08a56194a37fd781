"""The cluster's trust settings: token auth by default, a warning whenever it is disabled, the
embedded cluster's own private token, and the leftovers of a killed driver's cluster stopped
by the session it recorded."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from helpers.waiting import wait_for
from sweep.orchestrate.ray.env import AUTH_DISABLED_WARNING, ray_environment, state_dir, stop_leftover_sessions
from sweep.config import compose

DRIVER = """
import os, sys
from sweep.orchestrate.ray.env import ray_environment
from sweep.config import compose
cluster = compose([]).cluster
ray_environment(cluster)  # as sweep run does, before Ray is imported
from sweep.orchestrate.ray import tuner as tune
tune.start_ray(cluster)
import ray
print("TOKEN_PATH", os.environ.get("RAY_AUTH_TOKEN_PATH"), flush=True)
print("GCS", ray.get_runtime_context().gcs_address, flush=True)
print("READY", flush=True)
sys.stdin.read()  # until killed
"""


@pytest.fixture
def ray_env(monkeypatch, tmp_path):
    """ray_environment may set these in this process: restore them afterwards."""
    for var in ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.setenv(var, os.environ.get(var, "x"))
        monkeypatch.delenv(var)
    monkeypatch.setenv("SWEEP_STATE_DIR", str(tmp_path / "state"))


def test_the_default_cluster_uses_token_auth():
    cluster = compose([]).cluster
    assert cluster.address is None and cluster.auth == "token"


def test_disabled_auth_warns_naming_the_risk(ray_env, caplog):
    local = compose([]).cluster
    with caplog.at_level(logging.WARNING, logger="sweep.orchestrate.ray.env"):
        ray_environment(dataclasses.replace(local, address="10.0.0.5:6379"))
        assert caplog.records == []
        ray_environment(dataclasses.replace(local, address="10.0.0.5:6379", auth="disabled"))
    assert [r.getMessage() for r in caplog.records] == [AUTH_DISABLED_WARNING]
    assert "any process that can reach the cluster's ports can run code in it" in AUTH_DISABLED_WARNING
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_sweep_run_warns_when_auth_is_disabled(tmp_path):
    """`sweep run cluster.auth=disabled` on the embedded cluster: the warning on stderr (the
    sweep is rejected afterwards, before Ray starts: nothing to resume)."""
    exe = Path(sys.executable).with_name("sweep")
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    res = subprocess.run(
        [
            str(exe),
            "run",
            "cluster.auth=disabled",
            "model=tiny-llama",
            f"results.root={tmp_path}",
            "resume=true",
            "sweep.name=none",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "cluster.auth=disabled: any process that can reach the cluster's ports can run code in it" in res.stderr


def _no_ray_running() -> None:
    """A Ray this process started keeps its token (test_a_running_clusters_token_stays_...): these need none."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        pytest.skip("an embedded Ray runs in this test process: its token is kept, as the ray-tier test checks")


def test_embedded_token_is_private_and_per_process(ray_env, tmp_path):
    _no_ray_running()
    local = compose([]).cluster
    os.environ["RAY_AUTH_TOKEN"] = "inherited"
    ray_environment(local)
    path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    assert path.parent == tmp_path / "state" and path.name == f"{os.getpid()}.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text()) == 64 and "RAY_AUTH_TOKEN" not in os.environ
    token = path.read_text()
    ray_environment(local)  # again in the same process: the same token (a running Ray has cached it)
    assert path.read_text() == token
    ray_environment(dataclasses.replace(local, address="127.0.0.1:6379"))  # an existing cluster: its own token
    assert "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert state_dir() == tmp_path / "state"


def test_a_token_this_process_made_is_never_rewritten(ray_env, tmp_path, monkeypatch):
    """Another state directory used in between (another sweep's, a test's): back in the first, the token there is
    the one it was, since a Ray started with it reads it again for every worker it starts."""
    _no_ray_running()
    local = compose([]).cluster
    ray_environment(local)
    first = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    token = first.read_text()
    monkeypatch.setenv("SWEEP_STATE_DIR", str(tmp_path / "other"))
    ray_environment(local)
    assert Path(os.environ["RAY_AUTH_TOKEN_PATH"]).parent == tmp_path / "other"
    monkeypatch.setenv("SWEEP_STATE_DIR", str(tmp_path / "state"))
    ray_environment(local)
    assert Path(os.environ["RAY_AUTH_TOKEN_PATH"]) == first and first.read_text() == token


def test_a_running_clusters_token_stays_while_other_state_directories_come_and_go(ray_session, tmp_path, monkeypatch):
    """With the embedded Ray up, a sweep under another state directory, then one under the first again: a worker
    process started afterwards (its own runtime environment: a fresh process) still registers."""
    import ray

    local = compose([]).cluster
    path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    token = path.read_text()
    monkeypatch.setenv("SWEEP_STATE_DIR", str(tmp_path / "other"))
    ray_environment(local)
    monkeypatch.delenv("SWEEP_STATE_DIR")
    ray_environment(local)
    assert Path(os.environ["RAY_AUTH_TOKEN_PATH"]) == path and path.read_text() == token

    @ray.remote(num_cpus=0, runtime_env={"env_vars": {"SWEEP_FRESH_WORKER": tmp_path.name}})
    def pid() -> int:
        return os.getpid()

    assert ray.get(pid.remote()) != os.getpid()


@pytest.fixture(scope="module")
def embedded_driver(tmp_path_factory):
    """A `sweep run`-like driver in a child process: its embedded cluster started through
    ray_environment and sweep.orchestrate.ray.start.start_ray, with a private HOME and state dir."""
    tmp = tmp_path_factory.mktemp("driver")
    home, state = tmp / "home", tmp / "state"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SWEEP_"))}
    env.update(HOME=str(home), SWEEP_STATE_DIR=str(state), RAY_AUTH_TOKEN="inherited", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    info = {"proc": proc, "home": home, "state": state}
    for line in proc.stdout:
        key, _, value = line.decode().strip().partition(" ")
        if key == "READY":
            break
        info[key] = value
    else:
        pytest.fail(f"the driver did not start: {proc.stderr.read().decode()[-2000:]}")
    yield info
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWEEP_STATE_DIR", str(state))
        stop_leftover_sessions(grace_s=1.0)


@pytest.mark.ray
def test_the_embedded_cluster_uses_its_own_private_token(embedded_driver):
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    default_token = Path.home() / ".ray" / "auth_token"
    before = hashlib.sha256(default_token.read_bytes()).hexdigest() if default_token.exists() else None
    path = Path(embedded_driver["TOKEN_PATH"])
    assert path == embedded_driver["state"] / f"{embedded_driver['proc'].pid}.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not (embedded_driver["home"] / ".ray").exists()  # Ray neither wrote nor needed ~/.ray/auth_token
    # the cluster's own processes read the same file
    raylet_envs = [
        (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        for pid in _children(embedded_driver["proc"].pid)
    ]
    assert raylet_envs and all(f"RAY_AUTH_TOKEN_PATH={path}".encode() in env for env in raylet_envs)

    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(grpc.insecure_channel(embedded_driver["GCS"]))

    def ask(token: str | None):
        metadata = [("authorization", f"Bearer {token}")] if token else []
        return stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), metadata=metadata, timeout=10)

    assert ask(path.read_text().strip()).cluster_id  # the private token is the cluster's
    for other in (None, "inherited", "0" * 64):  # no token, the environment's, any other: refused
        with pytest.raises(grpc.RpcError) as refused:
            ask(other)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    after = hashlib.sha256(default_token.read_bytes()).hexdigest() if default_token.exists() else None
    assert after == before


@pytest.mark.ray
@pytest.mark.faults
def test_a_killed_drivers_leftovers_are_stopped_by_its_recorded_session(embedded_driver, monkeypatch):
    proc, state = embedded_driver["proc"], embedded_driver["state"]
    record_path = state / f"{proc.pid}.session.json"
    record = json.loads(record_path.read_text())  # written by start_ray
    assert record["driver_pid"] == proc.pid and Path(record["session_dir"]).is_dir()
    recorded = {p["pid"] for p in record["processes"]}
    assert set(_children(proc.pid)) <= recorded

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # what dies with the driver (GCS, raylet: they watch their parent) goes first
    wait_for(
        lambda: not [p for p in recorded if _alive(p) and Path(_comm(p)).name in ("gcs_server", "raylet")],
        "the killed driver's GCS and raylet to exit",
    )
    survivors = [pid for pid in recorded if _alive(pid)]
    assert survivors, "nothing of the killed driver's cluster survived it here"
    comms = {pid: _comm(pid) for pid in survivors}
    names = sorted(comms.values())
    # Ray's agents outlive the killed driver here (what the record is for): the record stops them. Its python helpers
    # (the dashboard's, the log monitor) leave when they notice GCS is gone, which may be after the snapshot above.
    agents = {pid for pid, comm in comms.items() if comm.startswith("ray::") and comm.endswith("Agent")}
    monkeypatch.setenv("SWEEP_STATE_DIR", str(state))
    cleaned = stop_leftover_sessions(grace_s=2.0)
    assert [c["session_dir"] for c in cleaned] == [record["session_dir"]]
    assert agents and agents <= set(cleaned[0]["stopped"]), (names, cleaned)
    assert [pid for pid in survivors if _alive(pid)] == []
    assert not record_path.exists() and not (state / f"{proc.pid}.token").exists()
    assert stop_leftover_sessions() == []
    print(f"stopped after SIGKILL: {names} (pids {sorted(survivors)})")


@pytest.mark.faults
def test_a_reused_pid_is_never_stopped(monkeypatch, tmp_path):
    """A record whose pids now belong to unrelated processes (this test's own child) stops nothing."""
    monkeypatch.setenv("SWEEP_STATE_DIR", str(tmp_path / "state"))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {
            "driver_pid": 2**22 + 1,  # above pid_max's default: no such process
            "driver_start": 1,
            "session_dir": str(tmp_path / "ray" / "session_gone"),
            "processes": [{"pid": bystander.pid, "start": None}, {"pid": os.getpid(), "start": None}],
        }
        (state_dir() / f"{2**22 + 1}.session.json").write_text(json.dumps(record))
        cleaned = stop_leftover_sessions(grace_s=0.5)
        assert cleaned == [{"session_dir": record["session_dir"], "driver_pid": 2**22 + 1, "stopped": []}]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return "?"
