"""What a trial reports to the driver, in one place: its row as a structured value (never JSON text) beside the
figures a searcher reads. The worker builds a report (``trial_report``); the driver's writer, the Ray adapter and
the Optuna searcher read it (``row_of``, ``reported_metrics``). Ray-free: whatever carries it (Ray Tune's
``tune.report``) carries a plain dict."""

from __future__ import annotations

from typing import Any

from sweep.bench.estimators import row_speedup
from sweep.config.search import METRICS

ROW = "row"  # the report's key that holds the trial's row


def reported_metrics(row: dict) -> dict:
    """What the searcher sees: objectives of ok trials; None for others (Optuna marks them failed).
    ``speedup_wall`` is the ranked speedup the analysis ranks by (``sweep.bench.estimators.row_speedup``:
    capped at 1.0 from above where no compute was skipped, 1.0 inside the trial's A/A noise floor);
    the study keeps the measured ratio as a user attribute (``sweep.orchestrate.searches.study``)."""
    ok = row.get("status") == "ok"
    metrics = {m: (row.get(m) if ok else None) for m in METRICS}
    if ok:
        metrics["speedup_wall"] = row_speedup(row, "speedup_wall")
    return {"status": row.get("status"), **metrics}


def trial_report(
    row: dict,
    reports_left: int,
    *,
    cached: bool,
    computed_by: str | None = None,
    notes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One setting's report: its row (``ROW``) and the searcher's figures; ``reports_left``: the settings of its Tune
    trial still to report; ``cached``: a row that was already in the store; ``computed_by``: the concurrent sweep
    that computed it; ``notes``: lines the driver prints (``sweep.orchestrate.claims``: a claim taken over, a trial
    run unclaimed)."""
    report = {**reported_metrics(row), ROW: row, "cached": cached, "reports_left": reports_left}
    if computed_by is not None:
        report["computed_by"] = computed_by
    if notes:
        report["notes"] = list(notes)
    return report


def failed_report(error: str) -> dict[str, Any]:
    """The report of a Tune trial whose settings could not even be composed: no row, its error."""
    return {**reported_metrics({"status": "failed"}), "error": error, "cached": False}


def row_of(report: dict | None) -> dict | None:
    """The row a report carries, or None (a trial whose config did not compose)."""
    return (report or {}).get(ROW)
