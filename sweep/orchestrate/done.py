"""The rows already under a results root, and which of them count as done: what the planner skips, what a worker
reports again instead of computing, and what a resumed search counts. Ray-free."""

from __future__ import annotations

from pathlib import Path

from sweep.config import Config
from sweep.errors import SweepError

DONE_STATUSES = ("ok", "nondeterministic", "stopped")  # rows that count as done; failed trials are redone


def row_path(root: str | Path, model: str, gate: str, trial_id: str) -> Path:
    """Where the trials table keeps a trial's row (``sweep.store.table_path``)."""
    from sweep.store import table_path

    return table_path("trials", root, {"model": model, "gate": gate}, trial_id)


def finished_row(path: Path) -> dict | None:
    """The row in ``path`` if it counts as done (``DONE_STATUSES``), else None."""
    import polars as pl

    from sweep.store import read_file

    if not path.is_file():
        return None
    try:
        rows = read_file("trials", path).to_dicts()
    except (OSError, SweepError, pl.exceptions.PolarsError):
        return None
    return rows[0] if len(rows) == 1 and rows[0].get("status") in DONE_STATUSES else None


def done_rows(cfg: Config) -> dict[str, dict]:
    """Rows already under results.root that count as done, by trial id (unless sweep.rerun)."""
    import polars as pl

    from sweep.store import scan

    if cfg.sweep.rerun:
        return {}
    rows = scan("trials", cfg.results.root).filter(pl.col("status").is_in(DONE_STATUSES)).collect()
    return {r["trial_id"]: r for r in rows.sort("created_at").iter_rows(named=True)}


def row_ids(root: str | Path) -> set[str]:
    """The trial ids with a row under ``root``, whatever its status (a resumed Optuna sweep counts
    a study trial done only when its row exists: ``sweep.orchestrate.searches.study.remaining_trials``)."""
    from sweep.store import scan

    return set(scan("trials", root).select("trial_id").collect()["trial_id"].to_list())


def sweep_rows(root: str | Path, name: str) -> set[str]:
    """The trial ids of the rows sweep ``name`` wrote under ``root`` (``sweep_name``)."""
    import polars as pl

    from sweep.store import scan

    rows = scan("trials", root).filter(pl.col("sweep_name") == name).select("trial_id").collect()
    return set(rows["trial_id"].to_list())
