"""`sweep bench`: prepare one trial (the shared workload loader), run it fresh, write its row, render it."""

from __future__ import annotations

import logging
from typing import Any

from sweep import progress
from sweep.tasks.evaluate import prepare as prepare_task
from sweep.bench.costs import cost_model
from sweep.bench.protocol import run_trial
from sweep.bench.sides import verify_positions
from sweep.bench.rows import complete_row, failed_row, format_row
from sweep.bench.session import Session, process_session
from sweep.textfit import fit_lines
from sweep.config import Config
from sweep.gates import Gate, check_model, make_gate
from sweep.gates.readouts import check_readouts_file
from sweep.models import LoadedModel, Shape, check_model_files, shape_before_load
from sweep.models.prompts import Prompt

log = logging.getLogger("sweep.bench.command")


def prepare(cfg: Config, session: Session | None = None) -> tuple[LoadedModel, Gate, list[Prompt]]:
    """`sweep bench`'s first step: its row's path checked (``_check_row``), then everything the trial needs loaded
    and checked (``load``); bad input fails here, before any work."""
    _check_row(cfg)
    return load(cfg, session)


def load(cfg: Config, session: Session | None = None) -> tuple[LoadedModel, Gate, list[Prompt]]:
    """Load and check everything a trial needs, from ``session`` (default: this process's): the model, the prompts
    and the gate, complete with its model and the readouts it reads. A sweep's worker loads its trials with it (its
    rows are the driver's to write: a failed row there is redone, not refused)."""
    with progress.phase("load", part="load"):
        return _load(cfg, process_session() if session is None else session)


def _load(cfg: Config, session: Session) -> tuple[LoadedModel, Gate, list[Prompt]]:
    prepare_task(cfg)  # the task's problems and files, and the sandbox its programs run in, before the model loads
    shape = check_fits(cfg)
    if cfg.gate.readouts is not None:  # its file, before the model loads (its fit to the loaded model after)
        check_readouts_file(cfg.gate.readouts, "gate.readouts", shape)

    def check(lm: LoadedModel) -> None:
        gate = make_gate(cfg.gate, lm.num_layers)  # the one check against the model, before tokenizing
        speculative, exits = cfg.bench.mode == "self_speculative", bool(gate.probe_layers())
        lm.require(
            lens=exits or speculative,
            kv_policy=cfg.bench.kv_policy if exits else None,
            crop=speculative,
            batch_size=cfg.bench.batch_size,
        )

    lm, prompts = session.workload(cfg, ("bench.gen_tokens", cfg.bench.gen_tokens), check=check)
    return lm, make_gate(cfg.gate, lm, gate_readouts(cfg.gate, lm, prompts, session)), prompts


def check_fits(cfg: Config, shapes: dict | None = None, files: bool = True) -> Shape | None:
    """Before the model loads: the gate's layer indices (and a PCA gate's k) against the model's depth and width
    read from its config or its file's header (``sweep.models.shape_before_load``; kept in ``shapes`` by model
    when given), one line as the check at load words it, seconds to minutes before that load; the shape (layers,
    hidden), or None where it cannot be read without the load (then the load checks). ``files``: and the model's
    own files (``check_model_files``; not where they are another machine's, a cluster's that a job is sent to)."""
    shapes = {} if shapes is None else shapes
    if (key := repr(cfg.model)) not in shapes:
        shapes[key] = shape_before_load(cfg.model)
    shape = shapes[key]
    if shape is not None:
        check_model(cfg.gate, shape.layers, shape.hidden)
    if files and (files_key := ("files", key)) not in shapes:
        check_model_files(cfg.model)  # a model directory that cannot load: one line, before the work
        shapes[files_key] = True
    return shape


def _check_row(cfg: Config) -> None:
    """Before any work: the row's path and the path it is kept at should its own fail are free of planted files (one
    line naming it), and a row a sweep wrote at either is replaced only with consent (sweep.rerun=true), never
    silently: a kept row under the same rule as a row in place. (A sweep's worker loads with ``load``: its rows
    are the driver's to write, under the sweep's rules.)"""
    from sweep.config.identity import trial_columns
    from sweep.errors import ConfigError
    from sweep.store import KEPT, check_row_path, table_path

    tid = trial_columns(cfg)["trial_id"]
    values = {"model": cfg.model.name, "gate": cfg.gate.name}
    path = check_row_path("trials", cfg.results.root, values, tid)
    if cfg.sweep.rerun:
        return
    for where in (path, table_path("trials", cfg.results.root, values, tid, KEPT)):
        owner = _sweep_of(where)
        if owner:
            raise ConfigError(
                f"sweep.rerun=false: trial {tid} already has a row from sweep {owner} ({where}); sweep.rerun=true "
                "replaces it, or write elsewhere with results.root"
            )
    if path.exists():
        log.info("replacing the earlier row of trial %s (%s, a sweep bench run)", tid, path)


def _sweep_of(path) -> str | None:
    """The sweep that wrote the row at ``path``; None when there is none, it is a bench's, or it cannot be read
    (an unreadable row is replaced: the store skips it anyway)."""
    from sweep.store import read_file

    if not path.is_file():
        return None
    try:
        earlier = read_file("trials", path).to_dicts()
    except Exception:  # noqa: BLE001
        return None
    return earlier[0].get("sweep_name") if earlier else None


def gate_readouts(gate_cfg, lm: LoadedModel, prompts: list[Prompt], session: Session, key: str = "gate.readouts"):
    """The fitted readouts a tuned lens or the classifier reads: loaded for this model (refused when
    fitted to another) and checked disjoint from the prompts it is evaluated on; None otherwise."""
    if gate_cfg.readouts is None:
        return None
    return session.readouts_for(gate_cfg.readouts, lm, prompts, key)


def measure(cfg: Config, prepared: tuple[LoadedModel, Gate, list[Prompt]]) -> dict[str, Any]:
    """The trial, run fresh: its row (a failed row when the trial raises)."""
    lm, gate, prompts = prepared
    log.info("bench %s on %s: %d prompts x %d tokens", gate.describe(), lm.name, len(prompts), cfg.bench.gen_tokens)
    try:
        return run_trial(cfg, lm, gate, prompts)
    except (RuntimeError, ValueError) as exc:  # CUDA out-of-memory is a RuntimeError
        log.error("trial failed: %s", exc)
        return failed_row(cfg, len(prompts), exc, gate)


def write_row(cfg: Config, prepared, row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The whole row (``complete_row``: with its provenance), one Parquet file under results.root: (its path,
    the row)."""
    from sweep.errors import SweepError
    from sweep.store import kept_line, unwritten_line, write_or_keep
    from sweep.store.run_info import new_run_id

    row = complete_row(cfg, prepared[0], row, cfg.run_id or new_run_id())
    tid = row["trial_id"]
    with progress.timed("writing"):
        try:
            path, failure = write_or_keep("trials", {k: [v] for k, v in row.items()}, root=cfg.results.root, stem=tid)
        except OSError as exc:  # nothing half-written (atomic); the row's figures are in the message
            raise SweepError(unwritten_line(row, exc, cfg.results.root)) from exc
    if failure is not None:  # the row is safe elsewhere under results.root; the bench still fails
        raise SweepError(kept_line(tid, failure, path))
    return str(path), row


def render(cfg: Config, prepared, row: dict[str, Any], written: tuple[str, dict]) -> tuple[list[str], int]:
    """The bench's summary (with the cost model's figures, kept with the model) and the row's path;
    exit code 1 when the trial did not end ok."""
    lm, gate, prompts = prepared
    costs = (
        cost_model(lm, prompts[0].input_ids, gates=[gate], kv_policies=[cfg.bench.kv_policy], **verify_positions([cfg]))
        if cfg.bench.cost_model and row["status"] != "failed"
        else None
    )
    return [fit_lines(format_row(written[1], costs)), f"row: {written[0]}"], 0 if row["status"] == "ok" else 1


def run_bench(cfg: Config, session: Session | None = None) -> tuple[str, dict[str, Any], str]:
    """`sweep bench` as a library call (``sweep.cli.verbs``' four steps): one trial, one Parquet row;
    returns (path, row, summary)."""
    prepared = prepare(cfg, session)
    row = measure(cfg, prepared)
    path, full = write_row(cfg, prepared, row)
    lines, _ = render(cfg, prepared, row, (path, full))
    return path, full, lines[0]
