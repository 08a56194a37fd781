"""What a sweep's workers compute, Ray-free: a Tune trial's settings, each claimed, computed (``trial_rows``, one
path for one setting or a bundle against one shared baseline) and reported once (a search's own pass in a worker is
the search's: ``sweep.orchestrate.searches``).

Whatever carries the reports is handed in: ``sweep.orchestrate.ray`` runs ``tune_trial`` in its workers with
Ray Tune's ``tune.report``; the reports are ``sweep.orchestrate.report``'s.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

from sweep.config import Config
from sweep.config.identity import trial_identity

from sweep.orchestrate.report import failed_report, trial_report
from sweep.orchestrate.settings import trial_config, tune_settings

Report = Callable[[dict], None]  # hands one report to the driver (Ray Tune's ``tune.report`` in a sweep)


def tune_trial(config: dict, base: list[str], context: dict, report: Report) -> None:
    """One Tune trial in a worker: one setting (``config["trial"]``) or a bundle of settings timed against one
    shared baseline (``config["trials"]``, ``sweep.shared_baseline``). Compose on the driver's device
    (``context["device"]``), report again the rows an earlier run left (``context["done"]``), claim the others in
    the results root and compute them (``run_claimed``), each setting reported once. A trial that raises reports
    its failed rows, once: Tune retries only a worker that died (``sweep.max_failures``), never a deterministic
    error."""
    t0 = time.perf_counter()
    try:
        cfgs = [trial_config(list(base), t, context["device"]) for t in tune_settings(config)]
        tids = [trial_identity(cfg, context["device"]).id for cfg in cfgs]
    except Exception as exc:  # noqa: BLE001 - a value the driver's checks could not foresee: no config, no row
        report(failed_report(_one_line(exc)))
        return
    done = context.get("done", {})
    todo = []
    left = iter(range(len(cfgs) - 1, -1, -1))  # every setting is reported once: cached, another sweep's, or computed
    for cfg, tid in zip(cfgs, tids):
        if tid in done:  # a row from an earlier run: report it again, do not redo the work
            report(trial_report(done[tid], next(left), cached=True))
        else:
            todo.append((tid, cfg))

    def computed(row: dict, **how) -> None:
        report(trial_report(row, next(left), **how))

    run_claimed(todo, context, t0, computed)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:500]


def run_claimed(
    todo: list[tuple[str, Config]],
    context: dict,
    t0: float,
    report: Callable[..., None],
) -> None:
    """A Tune trial's settings still to compute (``todo``: trial id and config), each claimed in the
    results root first (``sweep.orchestrate.claims``: a concurrent sweep into the same root computes it once),
    then computed together (one setting, or a bundle against one shared baseline); each setting's
    row goes to ``report(row, cached=..., computed_by=..., notes=...)`` once. Whatever the trial
    raises is the failed row of each setting not yet reported, never an error out of the worker:
    Tune retries only workers that died, not a deterministic error."""
    from sweep.orchestrate import claims
    from sweep.orchestrate.done import finished_row_of

    sweep_name = context.get("sweep_name")
    owner = claims.Owner.here(context["run_id"], sweep_name or "")
    notes: dict[str, tuple[str, ...]] = {}
    reported: set[str] = set()
    try:
        with contextlib.ExitStack() as stack:
            compute = []
            for tid, cfg in sorted(todo, key=lambda t: t[0]):  # one order of claims for every sweep: no deadlock
                at = (cfg.results.root, cfg.model.name, cfg.gate.name, tid, cfg.search)  # done under this sweep's rule
                ready = (lambda: None) if cfg.sweep.rerun else (lambda at=at: finished_row_of(*at))
                held = stack.enter_context(claims.hold(cfg.results.root, tid, owner, ready))
                notes[tid] = held.notes
                if held.row is not None:  # a concurrent sweep into the same root computed it
                    report(held.row, cached=True, computed_by=held.waited_for, notes=held.notes)
                    reported.add(tid)
                else:
                    compute.append(cfg)
            rows = trial_rows(compute, context["run_id"], sweep_name, t0) if compute else []
    except Exception as exc:  # noqa: BLE001 - whatever a trial raises is its failed row, not a dead worker
        from sweep.bench.rows import complete_row, failed_row

        seconds = time.perf_counter() - t0
        rows = [
            complete_row(
                cfg,
                None,
                failed_row(cfg, cfg.prompts.n or 0, exc),
                context["run_id"],
                sweep_name=sweep_name,
                seconds=seconds,
            )
            for tid, cfg in todo
            if tid not in reported
        ]
    for row in rows:
        report(row, cached=False, notes=notes.get(row["trial_id"], ()))


def trial_rows(
    cfgs: list[Config],
    run_id: str,
    sweep_name: str | None,
    t0: float,
) -> list[dict[str, Any]]:
    """A Tune trial's settings, run in this process's session (``sweep.bench.session``: its models, readouts
    and reusable references): one setting, or several of one model, prompts and bench against one shared
    baseline (``sweep.bench.protocol.run_trials``). One row per setting, in order (a failed row for a setting
    that cannot be prepared, the others measured without it; failed rows for all when the group raises, never
    an exception); ``trial_seconds`` is the row's bench_seconds plus an even share of the group's time outside
    the bench (preparing, provenance) since ``t0``. Under ``search.min_agreement`` a setting stops inside its group
    at a rung where its agreement cannot reach the bar (``stopping``): it decodes no further, its row is
    ``stopped``, and the others keep the shared baseline."""
    from sweep.bench.rows import complete_row, failed_row
    from sweep.bench.command import load
    from sweep.bench.protocol import run_trials
    from sweep.bench.session import process_session

    session = process_session()
    prepared: list = [None] * len(cfgs)
    rows: list = [None] * len(cfgs)
    for i, cfg in enumerate(cfgs):  # a setting that cannot run fails alone; its group runs without it
        try:
            prepared[i] = load(cfg, session)
        except Exception as exc:  # noqa: BLE001
            rows[i] = failed_row(cfg, cfg.prompts.n or 0, exc)
    ready = [i for i, p in enumerate(prepared) if p is not None]
    if ready:
        lm, prompts = prepared[ready[0]][0], prepared[ready[0]][2]
        group = [cfgs[i] for i in ready]
        try:
            gates = [prepared[i][1] for i in ready]
            source = session.reference_source(group[0])
            measured = run_trials(group, lm, gates, prompts, source, rungs=stopping(group))
        except Exception as exc:  # noqa: BLE001 - the group's failed rows, whatever it raised
            measured = [failed_row(cfgs[i], cfgs[i].prompts.n or 0, exc, prepared[i][1]) for i in ready]
        for i, row in zip(ready, measured):
            rows[i] = row
    # each row: its bench_seconds (0 for a failed one) and an even share of the rest of the group's time
    bench = [row.get("bench_seconds") or 0.0 for row in rows]
    rest = (time.perf_counter() - t0 - sum(bench)) / len(cfgs)
    return [
        complete_row(cfg, p[0] if p is not None else None, row, run_id, sweep_name=sweep_name, seconds=b + rest)
        for cfg, row, p, b in zip(cfgs, rows, prepared, bench)  # a setting that failed to prepare has no model
    ]


def stopping(cfgs: list[Config]):
    """The early-stop rule of a group under ``search.min_agreement`` (None without one): at each rung
    (``search.rung_prompts`` prompts, then twice as many, ...) a setting whose agreement's bootstrap interval
    (``sweep.analysis.agreement_interval``, seeded by its trial id) ends below the bar cannot reach it, and stops
    there with that bound."""
    bar = cfgs[0].search.min_agreement
    if bar is None:
        return None
    from sweep.analysis import agreement_interval
    from sweep.bench.protocol import Rungs
    from sweep.config.identity import trial_columns

    tids = [trial_columns(cfg)["trial_id"] for cfg in cfgs]

    def check(setting: int, agreement: list[float]) -> float | None:
        _, hi = agreement_interval(agreement, tids[setting])
        return hi if hi < bar else None

    return Rungs(cfgs[0].search.rung_prompts, check)
