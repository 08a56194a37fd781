"""Every private Ray and Ray-Optuna attribute the project reaches for, one function each.

Checked against Ray ``PINNED_RAY`` (tests/test_ray_private.py fails on any other release
and names the functions to re-check). Import after ``sweep.orchestrate.ray.env.ray_environment``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

PINNED_RAY = "2.60"
FUNCTIONS = (
    "single_node_mode",
    "bootstrap_address",
    "optuna_trial",
    "take_optuna_trial",
    "optuna_study",
    "embedded_session",
    "reset_token_cache",
    "set_trial_system_attr",
    "ask_gcs",
    "gcs_open",
    "own_sessions",
)


def single_node_mode() -> None:
    """Ray's single-machine mode in an already imported Ray: every server on 127.0.0.1.
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets it at import; Ray copies it to this constant.)"""
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def own_sessions() -> Iterator[None]:
    """Meanwhile, the processes Ray starts from this process (an embedded cluster's GCS, raylet, dashboard and
    monitors: ``services.start_ray_process``) each start a session of their own. A stop signal sent to the driver's
    process group (``timeout`` sends its signal to the group, as a shell's job control may) then reaches the driver,
    which stops the sweep and Ray in order, and not Ray's servers under it: a GCS killed first left the driver
    waiting 60 s for it, with no resume line and its claims held. On Linux (the project's platform: it reads
    ``/proc``) Ray still ties each of them to the driver's life with the parent-death signal, which ``setsid`` keeps,
    and stops them by pid."""
    import ray._private.services as services

    started = services.ConsolePopen

    class OwnSession(started):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = started


def bootstrap_address(address: str) -> str:
    """The GCS address ``address`` stands for; raises ConnectionError when there is none. ``auto``:
    the cluster of this machine as Ray finds it (``RAY_ADDRESS``, the address the last `ray start`
    recorded, a running GCS), as recorded: Ray's canonical form rewrites a loopback host to the
    machine's own address, where a cluster bound to 127.0.0.1 does not answer."""
    import ray._private.services as services

    if address == "auto":
        return services.get_ray_address_from_environment("auto", None)
    return services.canonicalize_bootstrap_address_or_die(address)


def optuna_trial(search: Any, trial_id: str) -> Any:
    """The Optuna trial an ``OptunaSearch`` runs for Tune trial ``trial_id``, or None."""
    return search._ot_trials.get(trial_id)


def take_optuna_trial(search: Any, trial_id: str) -> Any:
    """Take back the Optuna trial an ``OptunaSearch`` asked for Tune trial ``trial_id`` (its next ``suggest`` for
    that id asks the study again), or None."""
    return search._ot_trials.pop(trial_id, None)


def optuna_study(search: Any) -> Any:
    """The Optuna study an ``OptunaSearch`` drives."""
    return search._ot_study


def embedded_session() -> tuple[str, dict[str, list[int]]]:
    """The session directory of the Ray this driver started (``ray.init(address="local")``)
    and the pids of the processes it started (GCS, raylet, dashboard, monitors), by kind."""
    import ray._private.worker as worker

    node = worker._global_node
    if node is None or not hasattr(node, "all_processes"):
        from sweep.errors import SweepError

        raise SweepError("no embedded Ray started in this process (or this Ray release keeps its node elsewhere)")
    pids = {name: [info.process.pid for info in infos] for name, infos in node.all_processes.items()}
    return node.get_session_dir_path(), pids


def reset_token_cache() -> None:
    """Make an imported Ray re-read its auth settings and token (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH);
    only while no Ray is running in this process."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def set_trial_system_attr(trial: Any, key: str, value: Any) -> None:
    """Set an Optuna trial's system attribute (Optuna-private: ``Trial._trial_id``; the same
    call Optuna's own handling of ``constraints_func`` makes)."""
    trial.storage.set_trial_system_attr(trial._trial_id, key, value)


def ask_gcs(address: str, timeout_s: float = 5.0, tries: int = 3) -> tuple[str, str] | None:
    """What the GCS at ``address`` says when asked, over a channel as Ray makes it (its TLS settings, its token
    interceptor, no HTTP proxy), for its cluster id: ``("refused", reason)`` when it refuses the token (a missing or
    other token); ``("other", reason)`` when a gRPC server there has no GCS service (a raylet's port, the Ray Client
    server's); ``("silent", reason)`` when no try of ``tries`` (a second apart) reaches a gRPC server there at
    all (something else holds the port, an HTTP server say: ``ray.init`` would retry for minutes); else None (it
    answers, or is slow to: ``ray.init`` then decides). ``ray.init`` itself retries a refused token for about 20
    seconds and then names no token. Raises Ray's ``AuthenticationError`` when token auth is on and this client has
    no token at all (nothing is sent)."""
    import time

    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray._private.ray_constants import GLOBAL_GRPC_OPTIONS
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    silent = (grpc.StatusCode.UNAVAILABLE,)  # (a deadline passed may be a busy GCS: not judged here)
    for attempt in range(tries):
        if attempt:
            time.sleep(1.0)
        channel = init_grpc_channel(address, options=GLOBAL_GRPC_OPTIONS)
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
            return None
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return "refused", exc.details() or "unauthenticated"
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # a gRPC server without the GCS's service (a raylet's)
                return "other", exc.details() or "unimplemented"
            if exc.code() not in silent:
                return None
            reason = (exc.details() or exc.code().name).strip().splitlines()[0]
        finally:
            channel.close()
    return "silent", reason


def gcs_open(address: str, timeout_s: float = 5.0) -> bool | None:
    """Whether the GCS at ``address`` answers a client that sends no token (a cluster without token auth): True,
    False where it refuses one (token auth), None where this cannot be told (TLS, no answer)."""
    import os

    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        return True
    except grpc.RpcError as exc:
        return False if exc.code() == grpc.StatusCode.UNAUTHENTICATED else None
    finally:
        channel.close()
