"""The private Ray and Ray-Optuna attributes sweep reaches for (sweep/orchestrate/ray/internals.py), pinned
to the installed Ray: an upgrade fails here first, naming the functions to re-check."""

from __future__ import annotations

import pytest

from sweep.orchestrate.ray import internals as _ray_private


@pytest.fixture(scope="module")
def ray():
    from sweep.orchestrate.ray.env import ray_environment
    from sweep.config import compose

    ray_environment(compose([]).cluster)  # before Ray is imported, as sweep run does
    import ray

    return ray


def test_ray_is_the_pinned_release(ray):
    assert ray.__version__.startswith(_ray_private.PINNED_RAY), (
        f"Ray {ray.__version__} is not the pinned {_ray_private.PINNED_RAY}: re-check "
        f"{', '.join(_ray_private.FUNCTIONS)} in sweep/orchestrate/ray/internals.py, then update PINNED_RAY"
    )


def test_single_node_mode_sets_rays_cluster_constant(ray, monkeypatch):
    import ray._private.ray_constants as ray_constants

    assert hasattr(ray_constants, "ENABLE_RAY_CLUSTER")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    _ray_private.single_node_mode()
    assert ray_constants.ENABLE_RAY_CLUSTER is False


def test_bootstrap_address_reaches_rays_resolver(ray):
    import ray._private.services as services

    assert callable(getattr(services, "canonicalize_bootstrap_address_or_die", None))
    assert _ray_private.bootstrap_address("127.0.0.1:6379").endswith(":6379")


def test_reset_token_cache_reaches_rays_token_loader(ray):
    from ray._raylet import AuthenticationTokenLoader, Config

    assert callable(getattr(Config, "initialize", None))
    assert callable(getattr(AuthenticationTokenLoader.instance(), "reset_cache", None))
    _ray_private.reset_token_cache()  # no Ray runs in this process: allowed, and silent


def test_optuna_trial_reads_the_searchers_trials(ray):
    from ray.tune.search.optuna import OptunaSearch

    def space(trial):
        trial.suggest_float("x", 0.0, 1.0)

    search = OptunaSearch(space=space, metric="y", mode="max")
    assert isinstance(getattr(search, "_ot_trials", None), dict)
    search.suggest("t1")
    assert _ray_private.optuna_trial(search, "t1").params.keys() == {"x"}
    assert _ray_private.optuna_trial(search, "t2") is None


def test_set_trial_system_attr_reaches_optunas_storage(ray):
    import optuna

    study = optuna.create_study()
    trial = study.ask()
    assert isinstance(getattr(trial, "_trial_id", None), int)
    _ray_private.set_trial_system_attr(trial, "constraints", [0.5])
    assert study.trials[0].system_attrs["constraints"] == [0.5]


def test_every_private_reach_is_listed_and_tested():
    own = _ray_private.__name__
    functions = {n for n, f in vars(_ray_private).items() if callable(f) and getattr(f, "__module__", "") == own}
    assert functions == set(_ray_private.FUNCTIONS)


def test_a_node_that_cannot_start_workers_stops_the_sweep(ray):
    """Ray's refusal when a node's worker processes never register (its words, as a CI run printed them) is told
    apart from other refusals, and it stops every trial: they would wait for a worker forever."""
    from types import SimpleNamespace

    from sweep.orchestrate.ray.callbacks import StopWhenRowsCannotBeWritten
    from sweep.orchestrate.ray.hub import cannot_start_workers

    startup = (
        "The actor is not schedulable: Could not create the actor because worker startup repeatedly failed.\n"
        "Failed to startup worker after retrying 5 times."
    )
    assert cannot_start_workers(ray.exceptions.ActorUnschedulableError(startup))
    assert cannot_start_workers(ray.exceptions.TaskUnschedulableError(startup))
    assert not cannot_start_workers(ray.exceptions.ActorUnschedulableError("its placement group was removed"))
    assert not cannot_start_workers(ray.exceptions.RayError(startup))
    writer = SimpleNamespace(fatal=None)
    assert not StopWhenRowsCannotBeWritten(writer, SimpleNamespace(broken=None)).stop_all()
    assert StopWhenRowsCannotBeWritten(writer, SimpleNamespace(broken="worker startup repeatedly failed")).stop_all()


def test_ask_gcs_reaches_rays_grpc_channel_and_stubs(ray):
    import time

    from ray._private.grpc_utils import init_grpc_channel
    from ray._private.ray_constants import GLOBAL_GRPC_OPTIONS
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel("127.0.0.1:9", options=GLOBAL_GRPC_OPTIONS)
    try:
        assert callable(getattr(gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel), "GetClusterId", None))
    finally:
        channel.close()
    assert hasattr(gcs_service_pb2, "GetClusterIdRequest")
    # no gRPC server answers at port 9: silent, not a refusal, and said within the timeout
    t = time.perf_counter()
    reply = _ray_private.ask_gcs("127.0.0.1:9", timeout_s=2.0, tries=1)
    assert reply is not None and reply[0] == "silent", reply
    assert time.perf_counter() - t < 3.0


def test_gcs_open_reaches_rays_gcs_stub_over_a_plain_channel(ray):
    """The stub and request it builds are Ray's generated ones; a gRPC server without the GCS's service (its
    "unimplemented") tells nothing of a cluster's auth: None, as is no server at all."""
    import concurrent.futures

    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    assert hasattr(gcs_service_pb2_grpc, "NodeInfoGcsServiceStub") and hasattr(gcs_service_pb2, "GetClusterIdRequest")
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert _ray_private.gcs_open(f"127.0.0.1:{port}", timeout_s=5.0) is None
    finally:
        server.stop(None)
    assert _ray_private.gcs_open("127.0.0.1:9", timeout_s=2.0) is None


def test_own_sessions_reaches_the_popen_ray_starts_its_servers_with(ray):
    import os
    import sys

    import ray._private.services as services

    started = services.ConsolePopen
    with _ray_private.own_sessions():
        proc = services.ConsolePopen([sys.executable, "-c", "import os; print(os.getsid(0))"], stdout=-1, text=True)
        assert int(proc.communicate(timeout=60)[0]) == proc.pid != os.getsid(0)  # a session of its own
    assert services.ConsolePopen is started
