"""`sweep run` on the driver, Ray-free: plan, let the search choose its settings, run them in passes of Tune trials,
write their rows, and say how it ended.

``run_sweep`` plans (``sweep.orchestrate.plan``: bad input fails before Ray starts), opens the cluster through the
one Ray adapter (``sweep.orchestrate.ray.tuner.cluster``: an embedded Ray on 127.0.0.1, or a joined one) and hands it
to ``drive``, which needs of it only what ``Cluster`` names: each trial's resources and device, a search's pass in a
worker, and a pass of Tune trials whose events reach the driver's ``RowWriter``. SIGTERM stops a sweep as SIGINT
does (``sweep.orchestrate.interrupt``); however it ends, the claims this run still holds are released once Ray is
stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Protocol

from sweep.config import ClusterConfig, Config
from sweep.errors import SweepError
from sweep.textfit import counted
from sweep.orchestrate import claims, interrupt
from sweep.orchestrate.plan import (
    DEFINITION,
    baseline_groups,
    done_settings,
    plan_sweep,
    record_definition,
    select_trials,
)
from sweep.orchestrate.searches import SEARCHES, InWorker
from sweep.orchestrate.settings import Pass, Plan, trial_config
from sweep.orchestrate.writer import RowWriter, SweepOutcome

log = logging.getLogger("sweep.orchestrate.driver")


class Cluster(Protocol):
    """Where a sweep's trials run, as the driver sees it (``sweep.orchestrate.ray.tuner.TuneCluster``)."""

    resources: dict[str, float]  # CPUs and GPUs per Tune trial
    device: str  # the trials' device, as every trial id names it

    def in_worker(self, fn: Callable[..., Any], label: str, *args: Any) -> Any:
        """``fn(*args)`` in a worker with the trials' resources (a search's pass: ``InWorker``)."""

    def run(self, plan: Plan, batch: Pass, writer: RowWriter) -> bool:
        """One pass of Tune trials, their events handed to ``writer``; True if it was interrupted."""

    def broken(self) -> str | None:
        """Why no worker process can start (then nothing can run), or None."""

    def drain(self) -> None:
        """The workers' progress events still on their way, into this process's display."""


def run_sweep(cfg: Config, base_overrides: list[str]) -> SweepOutcome:
    """`sweep run`: plan the trials, open the cluster, drive the search through it, write the rows."""
    with interrupt.sigterm_as_sigint():  # (from the planning on: a SIGTERM then stops it in one line too)
        plan = plan_sweep(cfg, base_overrides)
        from sweep.orchestrate.ray.tuner import cluster

        try:
            with cluster(plan) as trials:
                return drive(plan, trials)
        except KeyboardInterrupt:  # before Tune ran: once the sweep is recorded, the line says how to resume it
            if (plan.path / DEFINITION).is_file():
                raise KeyboardInterrupt(interrupt.resume_hint(plan)) from None
            raise
        finally:
            claims.release_run(plan.root, plan.run_id)


def drive(plan: Plan, cluster: Cluster) -> SweepOutcome:
    """The search's own pass (``Search.select``: a screen, a profile, in a worker), the settings still to run, a pass
    of Tune trials, the passes that run again what Tune gave up on early (``run_again``) and the re-timing a search
    ends with (``retime``); the outcome with every row of the sweep's settings."""
    cfg, device = plan.cfg, cluster.device
    record_definition(plan)  # the work starts here: a run refused before leaves no sweep of its name
    search = SEARCHES.get(cfg.search.kind, key="search.kind")
    selection = search.select(plan, InWorker(cluster.in_worker, device))
    grid_trials, simulated = selection.settings, selection.simulated
    planned, _ = select_trials(grid_trials, plan.done, device, str(plan.root))
    if cfg.resume:
        # Tune's own restore unpickles tuner.pkl from (shared) storage: a planted file would run code. A resume
        # is rebuilt from data instead: the rows already written (skipped above) and, for Optuna, its SQLite study.
        log.info(
            "resuming sweep %s from its rows and study in %s (no pickled Tune state is loaded)", plan.name, plan.path
        )
    total = len(planned) if planned is not None else search.trials(plan, device)  # what this run runs
    size = total if planned is not None else cfg.search.n_trials  # the sweep's trials (an Optuna study's size)
    # shown with this run's rows at the end: a grid's done settings, or those a sampling search already held
    existing = done_settings(grid_trials, plan.done, device) if grid_trials is not None else search.held(plan, device)
    skipped = len(existing)  # the settings shown whose rows exist: not measured again (a grid's or a study's)
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
    writer = RowWriter(
        str(plan.root), total, plan.base, plan.run_id, plan.name, device, rerun=cfg.sweep.rerun, search=cfg.search
    )
    retimed: list[dict] = []
    try:
        interrupted = False
        if total:
            if planned is not None:
                batch = grid_pass(grid_trials, planned, cfg.sweep.shared_baseline)
            else:
                batch = Pass(study=search.searcher(plan, device), samples=total, done=plan.done)
            log.info(
                "sweep %s: %s in %s on %s (%g CPUs, %g GPUs per Tune trial); Tune state in %s",
                plan.name,
                counted(total, "setting"),
                counted(total if batch.values is None else len(batch.values), "Tune trial"),
                _cluster_label(cfg.cluster),
                cluster.resources["cpu"],
                cluster.resources["gpu"],
                plan.path,
            )
            interrupted = cluster.run(plan, batch, writer)
            interrupted = run_again(plan, cluster, writer, interrupted)
        if not interrupted and writer.fatal is None:
            again = search.retime(plan, device) if total else again
            interrupted = retime(plan, again, cluster, writer)
            # the re-timed settings' rows an earlier run wrote: shown beside the rows they re-time, as analyze ranks
            retimed = done_settings(_trials(plan, again, device), plan.done, device)
    finally:
        cluster.drain()
        writer.close()
    if writer.fatal is not None:  # a row could not be written: the sweep stopped; a resume redoes those trials
        raise SweepError(f"{writer.fatal}; {interrupt.resume_hint(plan)}")
    broken = cluster.broken()
    if broken is not None:  # no worker process starts: the sweep stopped rather than wait for one forever
        raise SweepError(f"{broken}; {interrupt.resume_hint(plan)}")
    return dataclasses.replace(
        outcome,
        rows=existing + retimed + writer.rows,
        written=writer.written,
        skipped=skipped + len(retimed) + writer.existing,
        overhead_s=writer.overheads,
        interrupted=interrupted,
        unrowed=writer.unrowed,
    )


def grid_pass(grid_trials, planned: list[list[str]], shared: int) -> Pass:
    """The settings ``planned`` as Tune trials: bundles of up to ``shared`` settings timed against one shared
    baseline (``baseline_groups``), or one setting each."""
    if shared > 1:
        return Pass("trials", baseline_groups(grid_trials, planned, shared))
    return Pass("trial", list(planned))


def run_again(plan: Plan, cluster: Cluster, writer: RowWriter, interrupted: bool) -> bool:
    """Run again, one setting per Tune trial, the settings of Tune trials given up on before their worker had
    died more than sweep.max_failures times (``RowWriter.gave_up``); at most sweep.max_failures passes, the last
    of which writes failed rows for what it gives up on. True if the sweep was interrupted."""
    passes = plan.cfg.sweep.max_failures
    for n in range(1, passes + 1):
        if not writer.retry or interrupted or writer.fatal is not None:
            break
        settings, writer.retry = writer.retry, []
        writer.last_pass = n == passes
        log.info("sweep %s: running %d setting(s) again whose Tune trial was given up early", plan.name, len(settings))
        interrupted = cluster.run(plan, Pass("trial", settings), writer)
    return interrupted


def retime(plan: Plan, settings: list[list[str]], cluster: Cluster, writer: RowWriter) -> bool:
    """Time again, one setting per Tune trial, the settings a search ends with (``Search.retime``: more rounds,
    hence other trial ids) that have no row yet. True if the sweep was interrupted."""
    device = cluster.device
    done = {**plan.done, **{r["trial_id"]: r for r in writer.rows}}
    todo, _ = select_trials(_trials(plan, settings, device), done, device, str(plan.root))
    if not todo:
        return False
    log.info(
        "sweep %s: re-timing the %d setting(s) the search ends with, to a noise floor of +-%g%% "
        "(analysis.floor_target)",
        plan.name,
        len(todo),
        100 * plan.cfg.analysis.floor_target,
    )
    writer.extend(len(todo))
    return cluster.run(plan, Pass("trial", todo), writer)


def _cluster_label(cluster: ClusterConfig) -> str:
    return "an embedded Ray on 127.0.0.1" if cluster.address is None else f"the Ray cluster at {cluster.address}"


def _trials(plan: Plan, settings: list[list[str]], device: str) -> list:
    """``settings`` (override lists) with their trial configs, as ``select_trials`` and ``done_settings`` take them."""
    return [(s, trial_config(plan.base, s, device)) for s in settings]
