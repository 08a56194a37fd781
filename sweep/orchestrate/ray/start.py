"""Starting or joining Ray for a sweep, and the resources each trial asks of it."""

from __future__ import annotations

import logging
import os

import ray

from sweep.config import ClusterConfig, Config
from sweep.errors import ConfigError, SweepError
from sweep.orchestrate.ray import internals as _ray_private

log = logging.getLogger("sweep.orchestrate.ray.start")


def start_ray(cluster: ClusterConfig) -> bool:
    """Start an embedded Ray on 127.0.0.1 or join ``cluster.address``; True if started here."""
    # Tune warns about every unfinished trial of an interrupted experiment; resume handles them
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # on a stop signal Tune names Ctrl-C and offers Tuner.restore (which unpickles): the resume line is ours; and
    # its own state, which a resume never reads, failing to save (a full disk) is a traceback per step: rows say it
    for name in ("ray.tune.tune", "ray.tune.execution.experiment_state", "ray.train._internal.syncer"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # a trial whose worker died: Tune's traceback of it (40 lines); the sweep says it in one ("lost its worker");
    # SWEEP_DEBUG=1 keeps Tune's tracebacks (a trial's own exception is a failed row's error either way)
    if not os.environ.get("SWEEP_DEBUG"):
        logging.getLogger("ray.tune.execution.tune_controller").setLevel(logging.CRITICAL)
    # Tune's TensorBoard logger warns of a result value it cannot plot (a claim's notes, a row's prompt ids; once per
    # process): the rows hold them, and the writer says what the notes say
    logging.getLogger("ray.tune.logger.tensorboardx").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_AUTH_MODE") != cluster.auth:
        raise SweepError(
            f"cluster.auth={cluster.auth}: Ray was imported with RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}; "
            "set it before Ray is imported"
        )
    if cluster.address is None:
        from sweep.orchestrate.ray.env import record_embedded_session, stop_leftover_sessions

        _ray_private.single_node_mode()  # servers on 127.0.0.1
        stop_leftover_sessions()  # what killed drivers of earlier embedded clusters left running
        with _ray_private.own_sessions():  # a stop signal to the driver's group stops the driver, not Ray under it
            ray.init(
                address="local",
                num_cpus=cluster.num_cpus,
                num_gpus=cluster.num_gpus,
                include_dashboard=cluster.dashboard,
                dashboard_host="127.0.0.1",
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        record_embedded_session()
    else:
        from sweep.orchestrate.ray.env import is_loopback

        address = _require_reachable(cluster.address)
        if is_loopback(address):  # `auto` found a cluster on 127.0.0.1: talk to it there, as for an explicit address
            _ray_private.single_node_mode()
        from ray.exceptions import AuthenticationError

        try:
            reply = _ray_private.ask_gcs(address)  # in a second: ray.init retries a refusal for 20 s, naming no token
            if reply is not None and reply[0] == "refused":
                raise ConfigError(_refused(cluster, reply[1]))
            if reply is not None:  # ray.init would retry for minutes, a warning every few seconds
                raise ConfigError(
                    f"cluster.address={cluster.address}: something answers at {address}, but not a Ray cluster's GCS "
                    f"({_first(reply[1])}); give the GCS's host:port (`ray start --head` prints it; 6379 unless set)"
                )
            if cluster.auth == "token" and _ray_private.gcs_open(address):  # else its workers never register
                raise ConfigError(
                    f"cluster.address={cluster.address}: the Ray cluster there runs without token auth "
                    "(it answers a client that sends none); set cluster.auth=disabled, its mode (docs/cluster.md)"
                )
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except AuthenticationError as exc:  # token auth, and no token here at all: Ray sends nothing
            raise ConfigError(_refused(cluster, str(exc), "Ray would not connect without a token")) from None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cluster.address={cluster.address}: cannot join a Ray cluster there ({str(exc).splitlines()[0]})"
            ) from None
    return True


def _refused(cluster: ClusterConfig, reason: str, who: str = "the Ray cluster there refused this client's token"):
    return (
        f"cluster.address={cluster.address}: {who} ({_first(reason)}); "
        f"set cluster.auth to the cluster's mode (now {cluster.auth}) and give its token (RAY_AUTH_TOKEN or "
        "RAY_AUTH_TOKEN_PATH; docs/cluster.md)"
    )


def _first(reason: str) -> str:
    """Ray's or gRPC's first line, cut where a word ends (and said to be cut) past 160 characters."""
    first = (reason.strip().splitlines() or [""])[0]
    return first if len(first) <= 160 else first[:160].rsplit(" ", 1)[0] + " ..."


def _require_reachable(address: str) -> str:
    """The cluster's address (``auto`` resolved); fails in seconds, not minutes of retries, when
    nothing answers there."""
    import socket

    resolved = address
    if address == "auto":
        try:
            resolved = _ray_private.bootstrap_address("auto")
        except ConnectionError as exc:
            raise ConfigError(
                f"cluster.address=auto: no running Ray cluster found on this machine ({str(exc).splitlines()[0]})"
            ) from None
    host, _, port = resolved.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise ConfigError(
            f"cluster.address={address}: nothing answers at {resolved}; start the cluster or fix the address "
            "(host:port of the GCS)"
        ) from None
    return resolved


def stop_ray() -> None:
    ray.shutdown()


def trial_resources(cfg: Config) -> dict[str, float]:
    """CPUs and GPUs per trial, checked against the cluster before any trial starts.

    A request the cluster can never satisfy would leave trials PENDING forever.
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpus_per_node = [n["Resources"].get("GPU", 0.0) for n in nodes]
    cpus_per_node = [n["Resources"].get("CPU", 0.0) for n in nodes]
    gpu = cfg.resources.gpu
    if gpu == "auto":
        gpu = 1.0 if max(gpus_per_node, default=0) >= 1 and cfg.device != "cpu" else 0.0
    if gpu > max(gpus_per_node, default=0.0):
        raise ConfigError(
            f"resources.gpu={cfg.resources.gpu}: no node of this cluster has {gpu:g} GPU(s) "
            f"(GPUs per node: {gpus_per_node or [0]}); use resources.gpu=0 or resources.gpu=auto"
        )
    if cfg.device == "cuda" and gpu == 0:
        why = (
            "resources.gpu=auto, and no node of this cluster has a GPU"
            if cfg.resources.gpu == "auto"
            else f"resources.gpu={cfg.resources.gpu:g}"
        )
        raise ConfigError(f"device=cuda: this sweep gives trials no GPU ({why}); use device=cpu or auto")
    if cfg.resources.cpu > max(cpus_per_node, default=0.0):
        raise ConfigError(
            f"resources.cpu={cfg.resources.cpu:g}: no node of this cluster has that many CPUs "
            f"(CPUs per node: {cpus_per_node})"
        )
    return {"cpu": float(cfg.resources.cpu), "gpu": float(gpu)}


def require_cuda(cfg: Config, resources: dict[str, float], wait_s: float = 60.0) -> None:
    """A trial given a GPU of this cluster sees CUDA there: asked once, before any trial, in a task with a trial's
    resources (a node that advertises a GPU its torch cannot use would fail every trial, one by one). When no GPU
    frees within ``wait_s`` (other work holds them) or the task cannot run, the trials go on unasked."""
    probe = ray.remote(num_cpus=resources["cpu"], num_gpus=resources["gpu"])(_no_cuda_here)
    ref = probe.remote()
    try:
        ready, _ = ray.wait([ref], timeout=wait_s)
        if not ready:
            ray.cancel(ref, force=True)
            log.info("no GPU of the cluster was free for %.0f s to check CUDA on; the trials will say", wait_s)
            return
        seen = ray.get(ref)
    except ray.exceptions.RayError as exc:
        log.info("the check that a GPU task sees CUDA did not run (%s)", str(exc).strip().splitlines()[0])
        return
    if seen is not None:
        raise ConfigError(
            f"resources.gpu={cfg.resources.gpu}: the cluster advertises GPUs, but a task given one there sees no "
            f"CUDA device ({seen}); use device=cpu, or resources.gpu=0"
        )


def _no_cuda_here() -> str | None:
    """None where torch sees a CUDA device; else torch's version and build."""
    import torch

    if torch.cuda.is_available():
        return None
    build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
    return f"torch {torch.__version__}, {build}"
