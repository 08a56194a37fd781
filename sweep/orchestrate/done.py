"""The rows already under a results root, and which of them count as done: what the planner skips, what a worker
reports again instead of computing, and what a resumed search counts. Ray-free."""

from __future__ import annotations

import logging
from pathlib import Path

from sweep.config import Config
from sweep.errors import SweepError

log = logging.getLogger("sweep.orchestrate.done")

DONE_STATUSES = ("ok", "nondeterministic", "stopped")  # rows that count as done; failed trials are redone


def row_path(root: str | Path, model: str, gate: str, trial_id: str, under: str = "") -> Path:
    """Where the trials table keeps a trial's row (``sweep.store.table_path``; ``under=KEPT``: where it is kept when
    its own path cannot be written)."""
    from sweep.store import table_path

    return table_path("trials", root, {"model": model, "gate": gate}, trial_id, under)


def counts_as_done(row: dict, search) -> bool:
    """Whether ``row`` counts as done for a sweep under ``search`` (None: any done status). Failed rows never. A
    row stopped early counts only under this sweep's own stopping rule (``search.min_agreement`` and
    ``search.rung_prompts``, which a stopped row records): another sweep's bar is not this one's, so a sweep under
    another rule, or none, measures that setting itself (and its row replaces the stopped one). Likewise a row whose
    task side stopped early (``accuracy_loss_min``, search.max_accuracy_loss) counts only for a sweep that would
    stop it too: one whose search.max_accuracy_loss that certain loss exceeds. Other ok and nondeterministic rows
    always count."""
    status = row.get("status")
    if search is None:
        return status in DONE_STATUSES
    if status == "stopped":
        rule = (row.get("stop_min_agreement"), row.get("stop_rung_prompts"))
        return rule[0] is not None and rule == (search.min_agreement, search.rung_prompts)
    loss_min = row.get("accuracy_loss_min")
    if status in DONE_STATUSES and loss_min is not None:
        return search.max_accuracy_loss is not None and loss_min > search.max_accuracy_loss
    return status in DONE_STATUSES


def finished_row(path: Path, search=None) -> dict | None:
    """The row in ``path`` if it counts as done: for a sweep under ``search``, ``counts_as_done`` (a row stopped
    under another stopping rule does not); without one, any done status."""
    import polars as pl

    from sweep.store import broken_identity, read_file

    if not path.is_file():
        return None
    try:
        frame = read_file("trials", path)
    except (OSError, SweepError, pl.exceptions.PolarsError):
        return None
    if frame.height != 1:
        return None
    row = frame.row(0, named=True)
    if row["trial_id"] != path.stem or broken_identity(frame).any():
        log.warning(
            "%s: its row is not this trial's (trial_id %s; an edited, moved or copied file): measured again",
            path,
            row["trial_id"],
        )
        return None
    return row if counts_as_done(row, search) else None


def finished_row_of(root: str | Path, model: str, gate: str, trial_id: str, search=None) -> dict | None:
    """A trial's finished row (``finished_row``) at its own path, else where it was kept (``KEPT``): a kept row
    counts, and is replaced, under the same rules as a row in place."""
    from sweep.store import KEPT

    for under in ("", KEPT):
        try:
            path = row_path(root, model, gate, trial_id, under)
        except SweepError:  # a link planted on the way leads out of the root: no row of ours there
            continue
        row = finished_row(path, search)
        if row is not None:
            return row
    return None


def done_rows(cfg: Config) -> dict[str, dict]:
    """Rows already under results.root that count as done for this sweep (``counts_as_done``), by trial id (unless
    sweep.rerun)."""
    import polars as pl

    from sweep.store import scan, trusted_rows

    if cfg.sweep.rerun:
        return {}
    rows = scan("trials", cfg.results.root).filter(pl.col("status").is_in(DONE_STATUSES)).collect()
    rows = trusted_rows(rows, cfg.results.root)
    done = (r for r in rows.sort("created_at").iter_rows(named=True) if counts_as_done(r, cfg.search))
    return {r["trial_id"]: r for r in done}


def check_models_unchanged(done: dict[str, dict], cfgs) -> None:
    """A model read from a user's own files (``model=hf`` a directory, ``model=gguf`` a file) that are not the files
    the rows counted as done measured (their ``model_hash``): a trial's id names the model's path, not its content,
    so those rows would stand for this model's settings with another model's figures. One line before the work,
    naming the path and what to do; ``cfgs``: the sweep's settings (their models, each checked once; a search that
    samples its settings, its base setting's model only). The files are read only where rows name their path."""
    import json
    import os

    from sweep.config.provenance import fingerprint_dir, fingerprint_file
    from sweep.errors import ConfigError

    models = {repr(c.model): c.model for c in cfgs if c.model.source in ("hf", "gguf") and c.model.path}
    for model in models.values():
        if not os.path.exists(model.path):  # a hub id: its revision is in its hash, its content the hub's
            continue
        measured = []
        for row in done.values():
            try:
                key = json.loads(row.get("trial_key") or "{}").get("model") or {}
            except ValueError:
                continue
            if (key.get("source"), key.get("path")) == (model.source, model.path):
                measured.append(row)
        if not measured:  # nothing to compare: the files are not read here (the load reads them)
            continue
        now = fingerprint_dir(model.path) if os.path.isdir(model.path) else fingerprint_file(model.path)
        stale = [row for row in measured if row.get("model_hash") != now]
        if stale:
            raise ConfigError(
                f"model.path={model.path}: its files are not the ones {len(stale)} row(s) under results.root measured "
                f"(model_hash {stale[0].get('model_hash')} then, {now} now), and those rows would count as this "
                "model's: measure them again with sweep.rerun=true, or write to another results.root"
            )


def row_ids(root: str | Path) -> set[str]:
    """The trial ids with a row under ``root``, whatever its status (a resumed Optuna sweep counts
    a study trial done only when its row exists: ``sweep.orchestrate.searches.study.remaining_trials``)."""
    from sweep.store import scan, trusted_rows

    rows = trusted_rows(scan("trials", root).select("trial_id", "trial_key", "model", "gate").collect(), str(root))
    return set(rows["trial_id"].to_list())


def sweep_rows(root: str | Path, name: str) -> set[str]:
    """The trial ids of the rows sweep ``name`` wrote under ``root`` (``sweep_name``)."""
    import polars as pl

    from sweep.store import scan, trusted_rows

    rows = scan("trials", root).filter(pl.col("sweep_name") == name).select("trial_id", "trial_key", "model", "gate")
    return set(trusted_rows(rows.collect(), str(root))["trial_id"].to_list())
