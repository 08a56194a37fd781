"""Executing a sweep: the Ray side of `sweep run` (its Optuna side is ``sweep.orchestrate.searches.study``).

`sweep run` plans on the driver (``sweep.orchestrate.plan``: what to run, what is done, names), starts
an embedded Ray bound to 127.0.0.1 (or joins a cluster), and runs bench trials through Ray
Tune: a grid, or Optuna as the search algorithm (its study persisted in SQLite beside
Tune's experiment). Each trial is a list of Hydra overrides; a worker composes it on the
device the driver resolved, reuses its process's model (one load per worker), runs the
bench and reports the row; the driver is the single writer of the rows (``sweep.orchestrate.writer``).
Ray Jobs submission is ``sweep.orchestrate.submit``; private Ray attributes are ``sweep.orchestrate.ray.internals``.

Importing this module imports Ray: call ``sweep.orchestrate.cluster_env.ray_environment`` first, since
Ray reads its auth mode and single-node mode when it is imported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import ray
from ray import tune

from sweep.config import ClusterConfig, Config
from sweep.config.identity import trial_device, trial_identity
from sweep.errors import SweepError
from sweep.orchestrate import claims, interrupt
from sweep.orchestrate.ray.callbacks import Progress, StopHopeless, StopWhenRowsCannotBeWritten
from sweep.orchestrate.plan import baseline_groups, done_settings, plan_sweep, select_trials, tune_settings
from sweep.orchestrate.ray.hub import Hub, cannot_start_workers, forwarding
from sweep.orchestrate.ray.internals import embedded_session
from sweep.orchestrate.ray.start import start_ray, stop_ray, trial_resources
from sweep.errors import os_error
from sweep.orchestrate.writer import RowWriter, SweepOutcome
from sweep.orchestrate.searches import SEARCHES, InWorker
from sweep.orchestrate.ray.searcher import reported_metrics
from sweep.orchestrate.settings import Plan, trial_config
from sweep.orchestrate.worker import run_claimed

log = logging.getLogger("sweep.orchestrate.ray.tuner")


# ---------------------------------------------------------------- Ray


# ---------------------------------------------------------------- the trial (runs in a worker)


def _trainable(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One Tune trial in a Ray worker (``_settings_trial``), its progress events forwarded to the driver."""
    context = context or {}
    with forwarding(context.get("progress"), f"Tune trial {tune.get_context().get_trial_id()}"):
        _settings_trial(config, base, context)


def _settings_trial(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One Tune trial in a Ray worker: one setting (``config["trial"]``) or a bundle of settings
    timed against one shared baseline (``config["trials"]``, ``sweep.shared_baseline``). Compose
    on the driver's device, claim each setting in the results root (``sweep.orchestrate.claims``: a concurrent
    sweep into the same root computes it once), bench (with this process's cached model), and
    report each setting's row. A trial that raises reports its failed rows, once: Tune retries
    only a worker that died (``sweep.max_failures``), never a deterministic error."""
    t0 = time.perf_counter()
    context = context or {}
    try:
        cfgs = [trial_config(list(base), t, context["device"]) for t in tune_settings(config)]
        tids = [trial_identity(cfg, context["device"]).id for cfg in cfgs]
    except Exception as exc:  # noqa: BLE001 - a value the driver's checks could not foresee: no config, no row
        tune.report({**reported_metrics({"status": "failed"}), "error": _one_line(exc), "cached": False})
        return
    done = context.get("done", {})
    todo = []
    left = iter(range(len(cfgs) - 1, -1, -1))  # every setting is reported once: cached, another sweep's, or computed
    for cfg, tid in zip(cfgs, tids):
        if tid in done:  # a row from an earlier run: report it again, do not redo the work
            _report(done[tid], next(left), cached=True)
        else:
            todo.append((tid, cfg))
    run_claimed(todo, context, t0, lambda row, **how: _report(row, next(left), **how), on_rung=_report_rung)


def _report_rung(row: dict) -> None:
    """A lone setting's agreement after its first prompts, to Tune: the row it ends with if it stops there
    (status ``stopped``), with the upper end of its agreement's interval, on which Tune's stopper decides
    (``sweep.orchestrate.ray.callbacks.StopHopeless``). Tune stops the trial inside this call, or it returns and the
    bench goes on."""
    metrics = {**reported_metrics(row), "row_json": json.dumps(row, default=str), "cached": False}
    check = {"rung": row["stopped_at_prompts"], "agreement_hi": row["stop_agreement_hi"]}
    tune.report({**metrics, "reports_left": 0, **check})


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:500]


def _report(
    row: dict, reports_left: int, *, cached: bool, computed_by: str | None = None, notes: tuple[str, ...] = ()
) -> None:
    """One setting's row to the driver (``Progress``); ``reports_left``: the bundle's settings still to
    report; ``notes``: lines the driver prints (``sweep.orchestrate.claims``: a claim taken over, a trial run
    unclaimed)."""
    extra = {} if computed_by is None else {"computed_by": computed_by}
    if notes:
        extra["notes"] = json.dumps(list(notes))
    metrics = {**reported_metrics(row), "row_json": json.dumps(row, default=str), "cached": cached, **extra}
    tune.report({**metrics, "reports_left": reports_left})


# ---------------------------------------------------------------- the driver


def run_sweep(cfg: Config, base_overrides: list[str]) -> SweepOutcome:
    """`sweep run`: plan the trials (bad values fail before Ray starts), start or join Ray,
    run them through Tune, write rows. SIGTERM stops it as SIGINT does (``sweep.orchestrate.interrupt``);
    however it ends, the claims this run still holds are released once Ray is stopped."""
    plan = plan_sweep(cfg, base_overrides)
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
        # inside a Ray job the working directory can be re-extracted under the driver; stand elsewhere
        plan.storage.mkdir(parents=True, exist_ok=True)
        os.chdir(plan.storage)
    with interrupt.sigterm_as_sigint():
        started = start_ray(plan.cfg.cluster)
        interrupt.keep_sigterm()  # Ray's driver installs its own SIGTERM handler (a stack dump, then abort)
        try:
            return _execute(plan)
        finally:
            if started:
                stop_ray()
            claims.release_run(plan.root, plan.run_id)


def _execute(plan: Plan) -> SweepOutcome:
    """Resolve the trials' resources and device, then run them with the actor that carries the workers'
    progress events, which the sweep stops however it ends (Tune's state may hold its handle)."""
    resources = trial_resources(plan.cfg)
    device = trial_device(plan.cfg.device, resources["gpu"])
    hub = Hub()
    try:
        return _run_trials(plan, resources, device, hub)
    finally:
        hub.close()


def _run_trials(plan: Plan, resources: dict, device: str, hub: Hub) -> SweepOutcome:
    """The search's own pass (``Search.select``: a screen, a profile, in a worker), pick the trials still to run,
    fit, reconcile."""
    cfg = plan.cfg
    search = SEARCHES.get(cfg.search.kind, key="search.kind")
    worker = InWorker(lambda fn, label, *args: _in_worker(fn, label, resources, hub, *args), device)
    selection = search.select(plan, worker)
    grid_trials, simulated = selection.settings, selection.simulated
    planned, skipped = select_trials(grid_trials, plan.done, device, str(plan.root))
    if cfg.resume:
        # Tune's own restore unpickles tuner.pkl from (shared) storage: a planted file would run code. A resume
        # is rebuilt from data instead: the rows already written (skipped above) and, for Optuna, its SQLite study.
        log.info(
            "resuming sweep %s from its rows and study in %s (no pickled Tune state is loaded)", plan.name, plan.path
        )
    total = len(planned) if planned is not None else search.trials(plan)  # what this run runs
    size = total if planned is not None else cfg.search.n_trials  # the sweep's trials (an Optuna study's size)
    existing = done_settings(grid_trials, plan.done, device)  # shown with this run's rows at the end
    outcome = SweepOutcome(plan.name, str(plan.path), str(plan.root), size, skipped, rows=existing, simulated=simulated)
    again = search.retime(plan, device) if total == 0 else []  # a finished search's settings may still need it
    if total == 0 and not again:
        why = (
            "nothing to run"
            if planned is not None
            else f"its study has all {cfg.search.n_trials} trials, each with its row"
        )
        log.info("sweep %s: %s", plan.name, why)
        return outcome
    writer = RowWriter(str(plan.root), total, plan.base, plan.run_id, plan.name, device, rerun=cfg.sweep.rerun)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's reporter at verbose=0 prints nothing; progress is ours
    try:
        interrupted = False
        if total:
            tuner = _tuner(plan, planned, total, resources, device, writer, hub, grid=grid_trials)
            shared = cfg.sweep.shared_baseline
            groups = baseline_groups(grid_trials, planned, shared) if planned is not None and shared > 1 else None
            log.info(
                "sweep %s: %s settings in %s Tune trials on %s (%g CPUs, %g GPUs per Tune trial); Tune state in %s",
                plan.name,
                total,
                total if groups is None else len(groups),
                _cluster_label(cfg.cluster),
                resources["cpu"],
                resources["gpu"],
                plan.path,
            )
            interrupted = _reconcile(_fit(tuner, plan, writer), writer, total)
            interrupted = run_again(plan, resources, device, writer, hub, interrupted)
        if not interrupted and writer.fatal is None:
            again = search.retime(plan, device) if total else again
            interrupted = retime(plan, again, resources, device, writer, hub)
    finally:
        hub.drain()
        writer.close()
    if writer.fatal is not None:  # a row could not be written: the sweep stopped; a resume redoes those trials
        raise SweepError(f"{writer.fatal}; {interrupt.resume_hint(plan)}")
    if hub.broken is not None:  # no worker process starts: the sweep stopped rather than wait for one forever
        raise SweepError(f"{workers_broken(hub.broken)}; {interrupt.resume_hint(plan)}")
    return dataclasses.replace(
        outcome,
        rows=existing + writer.rows,
        written=writer.written,
        skipped=skipped + writer.existing,
        overhead_s=writer.overheads,
        interrupted=interrupted,
        unrowed=writer.unrowed,
    )


def run_again(plan: Plan, resources: dict, device: str, writer: RowWriter, hub: Hub, interrupted: bool) -> bool:
    """Run again, one setting per Tune trial, the settings of Tune trials given up on before their worker had
    died more than sweep.max_failures times (``RowWriter.gave_up``); at most sweep.max_failures passes, the last
    of which writes failed rows for what it gives up on. True if the sweep was interrupted."""
    passes = plan.cfg.sweep.max_failures
    one_each = dataclasses.replace(plan.cfg, sweep=dataclasses.replace(plan.cfg.sweep, shared_baseline=1))
    for n in range(1, passes + 1):
        if not writer.retry or interrupted or writer.fatal is not None:
            break
        settings, writer.retry = writer.retry, []
        writer.last_pass = n == passes
        log.info("sweep %s: running %d setting(s) again whose Tune trial was given up early", plan.name, len(settings))
        tuner = _tuner(dataclasses.replace(plan, cfg=one_each), settings, len(settings), resources, device, writer, hub)
        interrupted = _reconcile(_fit(tuner, plan, writer), writer, len(settings))
    return interrupted


def retime(plan: Plan, settings: list[list[str]], resources: dict, device: str, writer: RowWriter, hub: Hub) -> bool:
    """Time again, one setting per Tune trial, the settings a search ends with (``Search.retime``: more rounds,
    hence other trial ids) that have no row yet. True if the sweep was interrupted."""
    done = {**plan.done, **{r["trial_id"]: r for r in writer.rows}}
    todo, _ = select_trials([(s, trial_config(plan.base, s, device)) for s in settings], done, device, str(plan.root))
    if not todo:
        return False
    log.info(
        "sweep %s: re-timing the %d setting(s) the search ends with, to a noise floor of +-%g%% "
        "(analysis.floor_target)",
        plan.name,
        len(todo),
        100 * plan.cfg.analysis.floor_target,
    )
    one_each = dataclasses.replace(plan.cfg, sweep=dataclasses.replace(plan.cfg.sweep, shared_baseline=1))
    writer.extend(len(todo))
    tuner = _tuner(dataclasses.replace(plan, cfg=one_each), todo, len(todo), resources, device, writer, hub)
    return _reconcile(_fit(tuner, plan, writer), writer, len(todo))


def _fit(tuner, plan: Plan, writer: RowWriter):
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
        if result.metrics and "row_json" in result.metrics:
            writer.write(json.loads(result.metrics["row_json"]), cached=bool(result.metrics.get("cached")))
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


def _forwarded(hub, label: str, fn, *args):
    """``fn(*args)`` in a Ray task, its progress forwarded to the driver under ``label``."""
    with forwarding(hub, label):
        return fn(*args)


def _in_worker(fn, label: str, resources: dict, hub: Hub, *args):
    """``fn(*args)`` in a Ray task with the trials' resources, the driver showing its forwarded progress while it
    waits; a sweep error raised there is raised here as it is (``InWorker``: a search's pass in a worker)."""
    task = ray.remote(num_cpus=resources["cpu"], num_gpus=resources["gpu"])(_forwarded)
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


def _tuner(plan: Plan, planned, num_samples: int, resources: dict, device: str, writer: RowWriter, hub: Hub, grid=None):
    cfg = plan.cfg
    context = {"run_id": plan.run_id, "sweep_name": plan.name, "device": device}
    context["progress"] = hub.actor
    context["done"] = {} if planned is not None else plan.done
    trainable = tune.with_resources(tune.with_parameters(_trainable, base=plan.base, context=context), resources)
    run_config = tune.RunConfig(
        name=plan.name,
        storage_path=str(plan.storage),
        failure_config=tune.FailureConfig(max_failures=cfg.sweep.max_failures),
        callbacks=[Progress(writer, hub)],
        stop=tune.stopper.CombinedStopper(StopWhenRowsCannotBeWritten(writer, hub), StopHopeless(cfg.search)),
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
    search_alg = SEARCHES.get(cfg.search.kind, key="search.kind").searcher(plan, device)
    # metric and mode live on the searcher only: TuneConfig(metric=, mode=) would make it single-objective
    tune_config = tune.TuneConfig(
        search_alg=search_alg, num_samples=num_samples, reuse_actors=True, trial_dirname_creator=_trial_dirname
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def _cluster_label(cluster: ClusterConfig) -> str:
    return "an embedded Ray on 127.0.0.1" if cluster.address is None else f"the Ray cluster at {cluster.address}"
