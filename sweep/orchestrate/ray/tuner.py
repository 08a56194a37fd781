"""Ray Tune, for the driver (``sweep.orchestrate.driver``): the cluster a sweep runs on (``cluster``, ``TuneCluster``),
a pass of Tune trials (a grid of settings or bundles, or Optuna as Tune's searcher) and a search's pass in a worker.

Each Tune trial runs ``sweep.orchestrate.worker.tune_trial`` in a Ray worker, its reports carried by ``tune.report``
and its progress events by the hub (``sweep.orchestrate.ray.hub``); on the driver, the callbacks
(``sweep.orchestrate.ray.callbacks``) hand them to the driver's row writer. Importing this module imports Ray:
call ``sweep.orchestrate.ray.env.ray_environment`` first, since Ray reads its auth mode and single-node mode when
it is imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import ray
from ray import tune

from sweep import progress
from sweep.config import Config
from sweep.config.identity import trial_device
from sweep.errors import SweepError, os_error
from sweep.orchestrate import interrupt
from sweep.orchestrate.ray.callbacks import Progress, StopWhenRowsCannotBeWritten
from sweep.orchestrate.ray.hub import Hub, cannot_start_workers, forwarding
from sweep.orchestrate.ray.internals import embedded_session
from sweep.orchestrate.ray.searcher import searcher
from sweep.orchestrate.ray.start import require_cuda, start_ray, stop_ray, trial_resources
from sweep.orchestrate.report import row_of
from sweep.orchestrate.settings import Pass, Plan
from sweep.orchestrate.worker import tune_trial
from sweep.orchestrate.writer import RowWriter

log = logging.getLogger("sweep.orchestrate.ray.tuner")


@contextlib.contextmanager
def cluster(plan: Plan) -> Iterator[TuneCluster]:
    """Start an embedded Ray on 127.0.0.1 or join ``cluster.address``, and the trials' cluster on it; Ray stopped
    after, if started here."""
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
        # inside a Ray job the working directory can be re-extracted under the driver; stand elsewhere
        plan.storage.mkdir(parents=True, exist_ok=True)
        os.chdir(plan.storage)
    try:
        started = start_ray(plan.cfg.cluster)
        interrupt.keep_sigterm()  # Ray's driver installs its own SIGTERM handler (sys.exit(15))
    except SystemExit as exc:  # a SIGTERM while Ray started, to the handler ray.init installed
        if not interrupt.stopped_during_start(exc):
            raise
        stop_ray()
        raise KeyboardInterrupt from None
    try:
        trials = TuneCluster.on(plan.cfg)
        try:
            yield trials
        finally:
            trials.close()
    finally:
        if started:
            stop_ray()


class TuneCluster:
    """Ray Tune on a running Ray: each trial's ``resources`` and ``device``, the hub that carries the workers'
    progress events (stopped however the sweep ends: Tune's state may hold its handle), a pass of Tune trials
    (``run``) and a search's pass in a worker (``in_worker``)."""

    def __init__(self, resources: dict[str, float], device: str, hub: Hub) -> None:
        self.resources, self.device, self.hub = resources, device, hub

    @classmethod
    def on(cls, cfg: Config) -> TuneCluster:
        """The trials' resources, checked against the cluster, and their device (a GPU's CUDA asked for)."""
        resources = trial_resources(cfg)
        device = trial_device(cfg.device, resources["gpu"])
        if device == "cuda":
            require_cuda(cfg, resources)
        return cls(resources, device, Hub())

    def broken(self) -> str | None:
        return None if self.hub.broken is None else workers_broken(self.hub.broken)

    def drain(self) -> None:
        self.hub.drain()

    def close(self) -> None:
        self.hub.close()

    def run(self, plan: Plan, batch: Pass, writer: RowWriter) -> bool:
        """``batch``'s Tune trials, fitted; the rows Tune holds that no callback wrote are written. True if the sweep
        was interrupted (trials left unfinished)."""
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's reporter at verbose=0 prints nothing; ours shows
        found = None if batch.values is not None else searcher(batch.study, plan.cfg.sweep.max_concurrent)
        with interrupt.stop_said(progress.note) as announce:
            tuner = _tuner(plan, batch, self.resources, self.device, writer, self.hub, found, announce)
            results = _fit(tuner, plan)
        ended = found is not None and getattr(found, "searcher", found).exhausted
        if ended:  # fewer settings than search.n_trials, as the space holds: the study ended, nothing interrupted it
            log.info(
                "sweep %s: the study's last %d proposals each repeated a setting this sweep has (its space looks "
                "spent), so it ends with %d settings of search.n_trials=%d",
                plan.name,
                getattr(found, "searcher", found).ASKS,
                len({(row_of(r.metrics) or {}).get("trial_id") for r in results} - {None}),
                batch.samples,
            )
        return _reconcile(results, writer, None if ended else batch.settings)

    def in_worker(self, fn, label: str, *args):
        """``fn(*args)`` in a Ray task with the trials' resources, the driver showing its forwarded progress while it
        waits; a sweep error raised there is raised here as it is (``InWorker``: a search's pass in a worker)."""
        task = ray.remote(num_cpus=self.resources["cpu"], num_gpus=self.resources["gpu"])(_forwarded)
        hub = self.hub
        try:
            ref = task.remote(hub.actor, label, fn, *args)
            while not ray.wait([ref], timeout=0.5)[0]:
                hub.drain()
                if hub.broken is not None:  # the task would wait for a worker process forever
                    ray.cancel(ref, force=True)
                    raise SweepError(workers_broken(hub.broken))
            hub.drain()
            return ray.get(ref)
        except ray.exceptions.TaskUnschedulableError as exc:
            if cannot_start_workers(exc):
                raise SweepError(workers_broken(str(exc).strip().splitlines()[0])) from None
            raise
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), SweepError) else None
            if cause is not None:
                raise cause from None
            raise


def _trainable(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One Tune trial in a Ray worker (``sweep.orchestrate.worker.tune_trial``), its reports through ``tune.report``
    and its progress events forwarded to the driver."""
    context = context or {}
    with forwarding(context.get("progress"), f"Tune trial {tune.get_context().get_trial_id()}"):
        tune_trial(config, list(base), context, tune.report)


def _forwarded(hub, label: str, fn, *args):
    """``fn(*args)`` in a Ray task, its progress forwarded to the driver under ``label``."""
    with forwarding(hub, label):
        return fn(*args)


def _fit(tuner, plan: Plan):
    """``tuner.fit()``; Tune's own state that cannot be written (a full disk under sweep.storage)
    is one line naming the file, as a row that cannot be written is (``RowWriter.fatal``)."""
    try:
        return tuner.fit()
    except Exception as exc:  # noqa: BLE001 - Tune wraps what its state writes raise in TuneError
        cause = interrupt.os_cause(exc)
        if cause is None:
            raise
        where = cause.filename or plan.path
        raise SweepError(f"cannot write Tune's state: {os_error(cause, where)}; {interrupt.resume_hint(plan)}") from exc


def _reconcile(results, writer: RowWriter, total: int | None) -> bool:
    """Write the rows Tune holds that no callback wrote (trials finished before a restore);
    True if the sweep was interrupted (trials left unfinished)."""
    unfinished = settings = 0
    for result in results:
        config = result.config or {}
        settings += len(config.get("trials") or [None])  # a bundle's settings; one otherwise (Optuna's too)
        row = row_of(result.metrics)
        if row is not None:
            writer.write(row, cached=bool(result.metrics.get("cached")))
        if result.error is None and not (result.metrics and "status" in result.metrics):
            unfinished += 1
        elif result.error is None and (result.metrics or {}).get("reports_left", 0) > 0:
            unfinished += 1  # a bundle stopped between its settings' reports
    return unfinished > 0 or settings < (total or 0)


def workers_broken(why: str) -> str:
    """The line a sweep stops with when Ray cannot start a worker process."""
    where = "the Ray session's logs/raylet.err"
    try:
        session, _ = embedded_session()
        where = f"{session}/logs/raylet.err"
    except SweepError:  # a joined cluster: its own nodes' logs
        pass
    return f"Ray cannot start a worker process, so no trial can run ({why}); the reason is in {where}"


def _tuner(plan: Plan, batch: Pass, resources: dict, device: str, writer: RowWriter, hub: Hub, found, announce):
    cfg = plan.cfg
    context = {"run_id": plan.run_id, "sweep_name": plan.name, "device": device, "progress": hub.actor}
    context["done"] = batch.done
    trainable = tune.with_resources(tune.with_parameters(_trainable, base=plan.base, context=context), resources)
    run_config = tune.RunConfig(
        name=plan.name,
        storage_path=str(plan.storage),
        failure_config=tune.FailureConfig(max_failures=cfg.sweep.max_failures),
        callbacks=[Progress(writer, hub, announce)],
        stop=StopWhenRowsCannotBeWritten(writer, hub),
        verbose=0,
    )
    if batch.values is not None:
        tune_config = tune.TuneConfig(
            max_concurrent_trials=cfg.sweep.max_concurrent, reuse_actors=True, trial_dirname_creator=_trial_dirname
        )
        param_space = {batch.key: tune.grid_search(batch.values)}
        return tune.Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config)
    # metric and mode live on the searcher only: TuneConfig(metric=, mode=) would make it single-objective
    tune_config = tune.TuneConfig(
        search_alg=found,
        num_samples=batch.samples,
        reuse_actors=True,
        trial_dirname_creator=_trial_dirname,
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"
