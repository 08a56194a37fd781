"""Executing a sweep: the Ray side of `sweep run` (its Optuna side is ``sweep.study``).

`sweep run` plans on the driver (``sweep.plan``: what to run, what is done, names), starts
an embedded Ray bound to 127.0.0.1 (or joins a cluster), and runs bench trials through Ray
Tune: a grid, or Optuna as the search algorithm (its study persisted in SQLite beside
Tune's experiment). Each trial is a list of Hydra overrides; a worker composes it on the
device the driver resolved, reuses its process's model (one load per worker), runs the
bench and reports the row; the driver is the single writer of the rows (``sweep.rows``).
Ray Jobs submission is ``sweep.submit``; private Ray attributes are ``sweep._ray_private``.

Importing this module imports Ray: call ``sweep.cluster_env.ray_environment`` first, since
Ray reads its auth mode and single-node mode when it is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time

import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter

from sweep import _ray_private, claims, progress
from sweep.config import ClusterConfig, Config
from sweep.errors import ConfigError, SweepError
from sweep.gatespec import GATE_SPECS
from sweep.identity import trial_device, trial_identity
from sweep.plan import (
    Plan,
    baseline_groups,
    done_settings,
    plan_sweep,
    screen_selection,
    select_trials,
    trial_config,
    tune_settings,
)
from sweep.progress_ray import Hub, forwarding
from sweep.rows import RowWriter, SweepOutcome, finished_row, last_error, row_path
from sweep.search import METRICS
from sweep.study import optuna_search, remaining_trials
from sweep.worker import screen_trace, shared_trial_rows, trial_row

log = logging.getLogger("sweep.tune")


# ---------------------------------------------------------------- Ray


def start_ray(cluster: ClusterConfig) -> bool:
    """Start an embedded Ray on 127.0.0.1 or join ``cluster.address``; True if started here."""
    # Tune warns about every unfinished trial of an interrupted experiment; resume handles them
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_AUTH_MODE") != cluster.auth:
        raise SweepError(
            f"cluster.auth={cluster.auth}: Ray was imported with RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}; "
            "set it before Ray is imported"
        )
    if cluster.address is None:
        from sweep.cluster_env import record_embedded_session, stop_leftover_sessions

        _ray_private.single_node_mode()  # servers on 127.0.0.1
        stop_leftover_sessions()  # what killed drivers of earlier embedded clusters left running
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
        _require_reachable(cluster.address)
        try:
            ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cluster.address={cluster.address}: cannot join a Ray cluster there ({str(exc).splitlines()[0]})"
            ) from None
    return True


def _require_reachable(address: str) -> None:
    """Fail in seconds, not minutes of retries, when nothing answers at the cluster address."""
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
            f"(GPUs per node: {gpus_per_node or [0]}); use resources.gpu=0 or gpu=auto"
        )
    if cfg.device == "cuda" and gpu == 0:
        raise ConfigError(
            "device=cuda: this sweep gives trials no GPU (resources.gpu=0 and the cluster has none); "
            "use device=cpu or auto"
        )
    if cfg.resources.cpu > max(cpus_per_node, default=0.0):
        raise ConfigError(
            f"resources.cpu={cfg.resources.cpu:g}: no node of this cluster has that many CPUs "
            f"(CPUs per node: {cpus_per_node})"
        )
    return {"cpu": float(cfg.resources.cpu), "gpu": float(gpu)}


# ---------------------------------------------------------------- the trial (runs in a worker)


def _trainable(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One Tune trial in a Ray worker (``_settings_trial``), its progress events forwarded to the driver."""
    context = context or {}
    with forwarding(context.get("progress"), f"Tune trial {tune.get_context().get_trial_id()}"):
        _settings_trial(config, base, context)


def _settings_trial(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One Tune trial in a Ray worker: one setting (``config["trial"]``) or a bundle of settings
    timed against one shared baseline (``config["trials"]``, ``sweep.shared_baseline``). Compose
    on the driver's device, claim each setting in the results root (``sweep.claims``: a concurrent
    sweep into the same root computes it once), bench (with this process's cached model), and
    report each setting's row."""
    t0 = time.perf_counter()
    context = context or {}
    try:
        cfgs = [trial_config(list(base), t, context["device"]) for t in tune_settings(config)]
        tids = [trial_identity(cfg, context["device"]).id for cfg in cfgs]
    except SweepError as exc:  # a value the driver's checks could not foresee: no config, so no row
        tune.report({**_metrics({"status": "failed"}), "error": str(exc), "cached": False})
        return
    done = context.get("done", {})
    todo = []
    left = iter(range(len(cfgs) - 1, -1, -1))  # every setting is reported once: cached, another sweep's, or computed
    for cfg, tid in zip(cfgs, tids):
        if tid in done:  # a row from an earlier run: report it again, do not redo the work
            _report(done[tid], next(left), cached=True)
        else:
            todo.append((tid, cfg))
    owner = claims.Owner.here(context["run_id"], context.get("sweep_name") or "")
    with contextlib.ExitStack() as stack:
        compute = []
        for tid, cfg in sorted(todo, key=lambda t: t[0]):  # one order of claims for every sweep: no deadlock
            path = row_path(cfg.results.root, cfg.model.name, cfg.gate.name, tid)
            ready = (lambda: None) if cfg.sweep.rerun else (lambda path=path: finished_row(path))
            held = stack.enter_context(claims.hold(cfg.results.root, tid, owner, ready))
            if held.row is not None:  # a concurrent sweep into the same root computed it
                _report(held.row, next(left), cached=True, computed_by=held.waited_for)
            else:
                compute.append(cfg)
        if len(compute) == 1:
            rows = [trial_row(compute[0], context["run_id"], context.get("sweep_name"), t0)]
        else:
            rows = shared_trial_rows(compute, context["run_id"], context.get("sweep_name"), t0) if compute else []
    for row in rows:
        _report(row, next(left), cached=False)


def _report(row: dict, reports_left: int, *, cached: bool, computed_by: str | None = None) -> None:
    """One setting's row to the driver (``Progress``); ``reports_left``: the bundle's settings still to report."""
    extra = {} if computed_by is None else {"computed_by": computed_by}
    metrics = {**_metrics(row), "row_json": json.dumps(row, default=str), "cached": cached, **extra}
    tune.report({**metrics, "reports_left": reports_left})


def _metrics(row: dict) -> dict:
    """What the searcher sees: objectives of ok trials; None for others (Optuna marks them failed)."""
    ok = row.get("status") == "ok"
    return {"status": row.get("status"), **{m: (row.get(m) if ok else None) for m in METRICS}}


# ---------------------------------------------------------------- the driver


def run_sweep(cfg: Config, base_overrides: list[str]) -> SweepOutcome:
    """`sweep run`: plan the trials (bad values fail before Ray starts), start or join Ray,
    run them through Tune, write rows."""
    plan = plan_sweep(cfg, base_overrides)
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
        # inside a Ray job the working directory can be re-extracted under the driver; stand elsewhere
        plan.storage.mkdir(parents=True, exist_ok=True)
        os.chdir(plan.storage)
    started = start_ray(plan.cfg.cluster)
    try:
        return _execute(plan)
    finally:
        if started:
            stop_ray()


def _execute(plan: Plan) -> SweepOutcome:
    """Resolve the trials' resources and device, pick the trials still to run, fit, reconcile."""
    cfg = plan.cfg
    resources = trial_resources(cfg)
    hub = None  # the actor holding the workers' progress events, once a worker runs
    device = trial_device(cfg.device, resources["gpu"])
    grid_trials, simulated = plan.grid_trials, None
    if cfg.search.kind == "screen":
        chosen = screened_before(plan, grid_trials, device) if cfg.resume else None
        if chosen is None:
            hub = Hub()
            grid_trials, simulated = _screen(plan, grid_trials, resources, device, hub)
        else:
            grid_trials = chosen
    planned, skipped = select_trials(grid_trials, plan.done, device, str(plan.root))
    total = len(planned) if planned is not None else cfg.search.n_trials
    existing = done_settings(grid_trials, plan.done, device)  # shown with this run's rows at the end
    outcome = SweepOutcome(plan.name, str(plan.path), str(plan.root), total or 0, skipped, rows=existing)
    outcome.simulated = simulated
    if planned == []:
        log.info("sweep %s: nothing to run", plan.name)
        return outcome
    writer = RowWriter(str(plan.root), total, plan.base, plan.run_id, plan.name, device, rerun=cfg.sweep.rerun)
    hub = hub or Hub()
    tuner = _tuner(plan, planned, resources, device, Progress(writer, hub), grid=grid_trials, hub=hub)
    if tuner is None:  # resume=true: the study has all its trials already
        log.info("sweep %s: its study has all %s Tune trials; nothing to run", plan.name, cfg.search.n_trials)
        return outcome
    size = cfg.sweep.shared_baseline
    bundles = len(baseline_groups(grid_trials, planned, size)) if planned is not None and size > 1 else total
    log.info(
        "sweep %s: %s settings in %s Tune trials on %s (%g CPUs, %g GPUs per Tune trial); Tune state in %s",
        *(plan.name, total, bundles, _cluster_label(cfg.cluster), resources["cpu"], resources["gpu"], plan.path),
    )
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's reporter at verbose=0 prints nothing; progress is ours
    interrupted = _reconcile(tuner.fit(), writer, total)
    hub.drain()
    writer.close()
    return dataclasses.replace(
        outcome,
        rows=existing + writer.rows,
        written=writer.written,
        skipped=skipped + writer.existing,
        overhead_s=writer.overheads,
        interrupted=interrupted,
    )


def _reconcile(results, writer: RowWriter, total: int | None) -> bool:
    """Write the rows Tune holds that no callback wrote (trials finished before a restore);
    True if the sweep was interrupted (trials left unfinished)."""
    unfinished = settings = 0
    for result in results:
        config = result.config or {}
        settings += len(config.get("trials") or [None])  # a bundle's settings; one otherwise (Optuna's too)
        if result.metrics and "row_json" in result.metrics:
            writer.write(json.loads(result.metrics["row_json"]), cached=bool(result.metrics.get("cached")))
        if result.error is None and not (result.metrics and "status" in result.metrics):
            unfinished += 1
        elif result.error is None and (result.metrics or {}).get("reports_left", 0) > 0:
            unfinished += 1  # a bundle stopped between its settings' reports
    return unfinished > 0 or settings < (total or 0)


def screened_before(plan: Plan, settings, device: str):
    """A resumed screen: the settings its earlier run selected for closed-loop trials (from
    its rows in the `simulated` table), or None when it never got that far."""
    import polars as pl

    from sweep.store import scan

    chosen = (
        scan("simulated", plan.root)
        .filter((pl.col("sweep_name") == plan.name) & pl.col("selected"))
        .select("trial_id")
        .collect()["trial_id"]
    )
    if chosen.len() == 0:
        return None
    keep = set(chosen.to_list())
    return [s for s in settings if trial_identity(s[1], device).id in keep]


def _traced(hub, *args):
    """``screen_trace`` in its Ray task, its progress forwarded to the driver."""
    with forwarding(hub, "screen trace"):
        return screen_trace(*args)


def _screen(plan: Plan, settings, resources: dict, device: str, hub: Hub):
    """Profile the model once (in a worker with the trials' resources), then replay every
    setting on the trace (``sweep.plan.screen_selection``); the settings to run closed-loop."""
    t0 = time.perf_counter()
    task = ray.remote(num_cpus=resources["cpu"], num_gpus=resources["gpu"])(_traced)
    probes = {  # the probes the standard cost model does not measure: pca, classifier, a tuned lens
        c.gate
        for _, c in settings
        if GATE_SPECS.get(c.gate.name, key="gate").probe not in ("none", "hidden", "lens") or c.gate.lens == "tuned"
    }
    probes = sorted(probes, key=str)
    readouts = {g.readouts for g in probes} - {None}
    if len(readouts) > 1:
        raise ConfigError(
            f"gate.readouts: a screen replays one trace, traced with one readouts file; "
            f"this search names {len(readouts)}"
        )
    try:
        ref = task.remote(hub.actor, plan.base, plan.run_id, device, probes)
        while not ray.wait([ref], timeout=0.5)[0]:
            hub.drain()
        hub.drain()
        traced = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), SweepError) else None
        if cause is not None:
            raise cause from None
        raise
    return screen_selection(plan, settings, traced, device, time.perf_counter() - t0)


def _tuner(plan: Plan, planned, resources: dict, device: str, callback, grid=None, hub: Hub | None = None):
    cfg, path = plan.cfg, plan.path
    context = {"run_id": plan.run_id, "sweep_name": plan.name, "device": device}
    context["progress"] = hub.actor if hub is not None else None
    context["done"] = {} if planned is not None else plan.done
    trainable = tune.with_resources(tune.with_parameters(_trainable, base=plan.base, context=context), resources)
    num_samples = cfg.search.n_trials
    if cfg.resume:
        # Tune's own restore unpickles tuner.pkl from (shared) storage: a planted file would run code. A resume
        # is rebuilt from data instead: the rows already written (skipped above) and, for Optuna, its SQLite study.
        log.info("resuming sweep %s from its rows and study in %s (no pickled Tune state is loaded)", plan.name, path)
        if planned is None:
            num_samples = remaining_trials(cfg.search, path)
            if num_samples == 0:
                return None
    run_config = tune.RunConfig(
        name=plan.name,
        storage_path=str(plan.storage),
        failure_config=tune.FailureConfig(max_failures=cfg.sweep.max_failures),
        callbacks=[callback],
        verbose=0,
    )
    if planned is not None:
        size = cfg.sweep.shared_baseline
        if size > 1:
            bundles = baseline_groups(plan.grid_trials if grid is None else grid, planned, size)
            param_space = {"trials": tune.grid_search(bundles)}
        else:
            param_space = {"trial": tune.grid_search(planned)}
        tune_config = tune.TuneConfig(
            max_concurrent_trials=cfg.sweep.max_concurrent, reuse_actors=True, trial_dirname_creator=_trial_dirname
        )
        return tune.Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config)
    search_alg = optuna_search(cfg.search, path, base=plan.base, device=device, root=plan.root)
    if cfg.sweep.max_concurrent is not None:
        search_alg = ConcurrencyLimiter(search_alg, max_concurrent=cfg.sweep.max_concurrent)
    # metric and mode live on the searcher only: TuneConfig(metric=, mode=) would make it single-objective
    tune_config = tune.TuneConfig(
        search_alg=search_alg, num_samples=num_samples, reuse_actors=True, trial_dirname_creator=_trial_dirname
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def _cluster_label(cluster: ClusterConfig) -> str:
    return "an embedded Ray on 127.0.0.1" if cluster.address is None else f"the Ray cluster at {cluster.address}"


class Progress(tune.Callback):
    """Tune callback on the driver: hands trial events to the row writer, and the workers' progress
    events (posted to ``hub``) to the display."""

    def __init__(self, writer: RowWriter, hub: Hub) -> None:
        self.writer, self.hub = writer, hub
        self.drained = 0.0

    def on_step_end(self, iteration, trials, **info):
        if time.perf_counter() - self.drained >= 0.5:
            self.drained = time.perf_counter()
            self.hub.drain(wait=False)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.writer.started(trial.trial_id)
        settings = tune_settings(trial.config) if trial.config else []
        if len(settings) > 1:
            progress.note(
                f"Tune trial {trial.trial_id}: {len(settings)} settings timed against one shared baseline in the "
                "same rounds (sweep.shared_baseline): their rows come together when its timed rounds end"
            )

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.hub.drain()  # the worker's last phases before its row
        self.writer.result(trial.trial_id, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.hub.drain()
        progress.finished(f"Tune trial {trial.trial_id}")

    def on_trial_recover(self, iteration, trials, trial, **info):
        failures = trial.run_metadata.num_failures
        log.warning("Tune trial %s lost its worker; retrying it (failures so far: %s)", trial.trial_id, failures)

    def on_trial_error(self, iteration, trials, trial, **info):
        progress.finished(f"Tune trial {trial.trial_id}")
        self.writer.errored(trial.config, last_error(trial.error_file))
