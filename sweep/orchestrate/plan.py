"""Planning a sweep, without Ray: what to run, what is already done, and the names.

``plan_sweep`` validates the sweep, names it, fixes its base overrides, composes every
trial it can foresee (a bad value fails here, before Ray starts) and reads the rows that
already count as done. Once the driver knows the trials' resources it resolves their
device (``sweep.config.identity.trial_device``) and ``select_trials`` keeps the trials still to
run; a worker composes its trial with ``trial_config`` on that same device, so the ids
the planner skips by are the ids the workers' rows carry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import logging
from pathlib import Path

from sweep.orchestrate import claims
from sweep.orchestrate.done import check_models_unchanged, done_rows
from sweep.config import Config, override_key, read_overrides
from sweep.errors import ConfigError, SweepError, first_line, os_error
from sweep.config.identity import trial_identity
from sweep.config.paths import check_tree, inside
from sweep.config.search import check_given, check_search
from sweep.orchestrate.searches import search_for
from sweep.orchestrate.settings import GridTrials, Plan

log = logging.getLogger("sweep.orchestrate.plan")

DRIVER_KEYS = ("resume", "sweep.name", "run_id", "results.root")  # overrides the driver sets for every trial


def plan_sweep(cfg: Config, overrides: list[str]) -> Plan:
    """Everything about a sweep that needs no cluster; bad input fails here."""
    from sweep.store.run_info import new_run_id

    check_search(cfg.search)  # (sweep.storage is checked a path when the config is validated)
    search = search_for(cfg.search)  # its kind known and its own keys checked
    check_given(cfg.search, {override_key(o) for o in overrides if "=" in o and not o.startswith("~")})
    run_id = cfg.run_id or new_run_id()
    root = Path(cfg.results.root).expanduser().resolve()
    cfg = dataclasses.replace(cfg, results=dataclasses.replace(cfg.results, root=str(root)))
    storage = _storage(cfg, root)
    name = sweep_name(cfg, storage, run_id)
    earlier = continued(cfg, search, storage, root)
    if earlier is not None:  # its selection is work of its own: a plain re-run continues it, as a resume does
        log.info(
            "continuing sweep %s, the earlier %s sweep with this run's definition, from its written selection or "
            "study (nothing is traced or drawn again; sweep.rerun=true starts afresh)",
            earlier,
            cfg.search.name,
        )
        cfg = dataclasses.replace(cfg, resume=True, sweep=dataclasses.replace(cfg.sweep, name=earlier))
        name = earlier
    # Tune and SQLite write where their paths lead: nothing under the sweep's directory may lead elsewhere
    if cfg.sweep.storage is not None:
        check_tree(storage, storage / name, key="sweep.storage")
    else:
        check_tree(root, storage / name, key="results.root")
    claims.check_dir(root)
    base = base_overrides(read_overrides(overrides, cfg), run_id, root)  # the paths as read, for every worker
    grid_trials = as_read(search.foresee(cfg, base))  # every setting it can foresee composed: a bad value fails here
    _check_row_paths(cfg, grid_trials)
    _check_task_inputs(cfg, grid_trials)
    _check_files_read(cfg, grid_trials)  # with each setting's gate against its model's depth and width
    check_definition(cfg, storage / name)  # checked now, recorded when the work starts (``record_definition``)
    done = done_rows(cfg)
    check_models_unchanged(done, [c for _, c in grid_trials or [(None, cfg)]])
    return Plan(cfg, run_id, root, storage, name, base, grid_trials, done)


def as_read(grid_trials: GridTrials | None) -> GridTrials | None:
    """Each foreseen setting's overrides as its config read them: a path a sub-space names (``PATH_KEYS``) as the
    path read here, a skip set as its canonical text (a ``file:`` set's layers, not a path a worker would read
    against its own working directory). The setting's config, and so its id, is unchanged."""
    from sweep.config.paths import quoted, read_overrides

    if grid_trials is None:
        return None
    out = []
    for trial, trial_cfg in grid_trials:
        trial = read_overrides(trial, trial_cfg)
        trial = [
            f"{o.partition('=')[0]}={quoted(trial_cfg.gate.skip)}"
            if override_key(o) == "gate.skip" and trial_cfg.gate.skip is not None
            else o
            for o in trial
        ]
        out.append((trial, trial_cfg))
    return out


def foresee_settings(cfg: Config, overrides: list[str]) -> GridTrials | None:
    """Every setting ``cfg``'s search can foresee, composed on the command line's ``overrides`` (its paths as read):
    a bad value in a sub-space fails here as it would in ``sweep run`` before Ray starts (jobs/submit.py checks with
    this before it submits); None for settings sampled later."""
    from sweep.store.run_info import new_run_id

    check_search(cfg.search)
    root = Path(cfg.results.root).expanduser().resolve()
    base = base_overrides(read_overrides(overrides, cfg), cfg.run_id or new_run_id(), root)
    trials = search_for(cfg.search).foresee(cfg, base)
    _check_depths(cfg, trials)
    return trials


def _check_depths(cfg: Config, grid_trials: GridTrials | None) -> None:
    """Each foreseen setting's gate against its model's depth and width where this machine reads them without a load
    (``check_fits``), as ``sweep run`` checks them before Ray starts; the files a setting reads are the cluster's."""
    from sweep.bench.command import check_fits

    shapes: dict = {}
    for _, trial_cfg in grid_trials or [(None, cfg)]:
        check_fits(trial_cfg, shapes, files=False)


DEFINITION = "sweep-definition.json"  # what defines a sweep, beside Tune's state in its directory


def definition(cfg: Config) -> dict:
    """What defines a sweep: its search (all but search.n_trials, which a resume may raise to search further),
    model, gate, prompts, bench, task, dtype, device and seed. Two runs under one sweep name must share it."""
    from sweep.config.identity import EVAL_KEYS

    search = {k: v for k, v in dataclasses.asdict(cfg.search).items() if k != "n_trials"}
    return {
        "search": search,
        "model": dataclasses.asdict(cfg.model),
        "gate": dataclasses.asdict(cfg.gate),
        "prompts": dataclasses.asdict(cfg.prompts),
        "bench": {k: v for k, v in dataclasses.asdict(cfg.bench).items() if k != "cost_model"},
        "eval": {k: v for k, v in dataclasses.asdict(cfg.eval).items() if k in EVAL_KEYS},
        "dtype": cfg.dtype,
        "device": cfg.device,
        "seed": cfg.seed,
    }


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in ("objectives", "constraints"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_definition(cfg: Config, directory: Path) -> None:
    """A sweep name is one configuration. A new sweep under a name that exists is refused (resume=true continues it);
    a resume whose definition differs from the one recorded is refused naming what differs; a recorded definition
    that is not one (not a regular file of at most ``userfiles.CAP`` bytes, not a JSON object, nested too deep) is
    one line naming it. Nothing is written here: ``record_definition`` records it once the sweep starts its work."""
    exists = directory.exists()
    if exists and not cfg.resume:
        raise ConfigError(
            f"sweep.name={directory.name}: a sweep of that name exists under {directory.parent}; resume=true "
            "continues it, or choose another sweep.name"
        )
    path = directory / DEFINITION
    if not (exists and os.path.lexists(path)):
        return  # a new sweep, or one from before definitions were recorded: this run's is recorded when it starts
    recorded, mine = _recorded(directory.name, path), _flat(_definition_json(cfg))
    # a search key recorded by a release whose kinds all carried every search key, which this run's kind lacks,
    # defines nothing here
    keys = set(mine) | {k for k in recorded if not k.startswith("search.")}
    differ = sorted(k for k in keys if recorded.get(k) != mine.get(k))
    if differ:
        first = differ[0]
        raise ConfigError(
            f"sweep.name={directory.name}: this run differs from the sweep's definition in {', '.join(differ[:4])}"
            f"{', ...' if len(differ) > 4 else ''} ({first}: {recorded.get(first)!r} there, "
            f"{mine.get(first)!r} here); resume it unchanged, or start a new sweep under another sweep.name"
        )


def _definition_json(cfg: Config) -> dict:
    import json

    return json.loads(json.dumps(definition(cfg), sort_keys=True, default=str))


def _recorded_form(cfg: Config) -> dict:
    """The definition as recorded: with search.n_trials, which a resume does not compare (a resume may raise it)
    and a plain re-run that continues an earlier sweep does (``continued``)."""
    recorded = _definition_json(cfg)
    recorded["search"]["n_trials"] = cfg.search.n_trials
    return recorded


def continued(cfg: Config, search, storage: Path, root: Path) -> str | None:
    """For a plain re-run (no resume, no sweep.name, no sweep.rerun): the most recent earlier sweep of this search
    under ``storage`` whose recorded definition is this run's, search.n_trials included, and whose selection its
    kind finds written (``Search.continues``: a screen's simulated rows, a skip-set study); None otherwise, and for a
    definition that cannot be read or was recorded without search.n_trials."""
    if cfg.resume or cfg.sweep.name is not None or cfg.sweep.rerun or not storage.is_dir():
        return None
    mine = _flat(_recorded_form(cfg))
    for path in reversed(_earlier_sweeps(storage, cfg.search.name)):
        if not path.is_dir() or path.is_symlink() or not os.path.lexists(path / DEFINITION):
            continue
        try:
            same = _recorded(path.name, path / DEFINITION) == mine
        except ConfigError:
            continue
        if same and search.continues(root, path):
            return path.name
    return None


def _recorded(name: str, path: Path) -> dict:
    """The definition recorded at ``path``, flattened; one line naming the file when it is not one."""
    from sweep.userfiles import read_json

    try:
        recorded = read_json(path)
        if not isinstance(recorded, dict):
            raise ValueError(f"a JSON {type(recorded).__name__}, not an object")
        return _flat(recorded)
    except (OSError, ValueError) as exc:
        why = first_line(exc)
        raise ConfigError(
            f"sweep.name={name}: its definition {path} cannot be read ({why}); move it away to resume with this "
            "run's definition"
        ) from None


def record_definition(plan: Plan) -> None:
    """Record the sweep's definition (``DEFINITION``) in its directory, once its work starts (Ray up, the cluster's
    resources checked): a run refused before that leaves no sweep of its name behind. Kept as it is when recorded
    already (``check_definition`` compared it)."""
    import json

    from sweep.store import atomic_write

    path = plan.path / DEFINITION
    if os.path.lexists(path):
        return
    text = json.dumps(_recorded_form(plan.cfg), sort_keys=True, indent=1)
    made = not plan.path.exists()
    try:
        plan.path.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    except OSError as exc:  # a full or read-only disk: before any work, one line naming the file, no sweep left
        if made:
            with contextlib.suppress(OSError):
                plan.path.rmdir()  # (only while empty)
        raise SweepError(f"cannot record the sweep's definition: {os_error(exc, path)}") from None


def _check_row_paths(cfg: Config, grid_trials: GridTrials | None) -> None:
    """Every row the sweep can foresee has a path nothing planted is in the way of (``check_row_path``); a search
    that samples later has its own settings' partitions checked for the sweep's base setting."""
    from sweep.config.identity import trial_identity, trial_device
    from sweep.store import check_row_path

    device = trial_device(cfg.device, 0 if cfg.resources.gpu == "auto" else float(cfg.resources.gpu))
    for _, trial_cfg in grid_trials or [(None, cfg)]:  # each setting's own row file (a directory planted as one)
        key = (trial_cfg.model.name, trial_cfg.gate.name)
        tid = trial_identity(trial_cfg, device).id
        check_row_path("trials", cfg.results.root, {"model": key[0], "gate": key[1]}, tid)


def _check_task_inputs(cfg: Config, grid_trials: GridTrials | None) -> None:
    """Before Ray starts: each task the sweep's settings evaluate can read its problems and files
    (``sweep.tasks.evaluate.check_inputs``), one line otherwise, instead of a failed row per setting."""
    from sweep.tasks.evaluate import check_inputs

    seen = set()
    for _, trial_cfg in grid_trials or [(None, cfg)]:
        e = trial_cfg.eval
        key = (e.task, tuple(e.harness_tasks or ()), e.harness_include, e.problems)
        if e.task is not None and key not in seen:
            seen.add(key)
            check_inputs(trial_cfg)


def _check_files_read(cfg: Config, grid_trials: GridTrials | None) -> None:
    """Before Ray starts: each prompt set and readouts file the sweep's foreseeable settings read (a search that
    samples later: its base setting's) can be read, as `sweep bench` reads them before its model loads; one line
    otherwise, instead of a failed row per setting. Each setting's gate is checked against its model's depth and
    width where they can be read before the model loads (``sweep.bench.command.check_fits``), readouts files
    against them too: a layer past the model's depth is one line here, not a failed row per setting after a load."""
    from sweep.bench.command import check_fits
    from sweep.gates.readouts import check_readouts_file
    from sweep.models.prompts import read_prompts

    prompt_sets, readouts, gates, shapes = {}, set(), set(), {}
    for _, trial_cfg in grid_trials or [(None, cfg)]:
        if (key := repr(trial_cfg.prompts)) not in prompt_sets:
            prompt_sets[key] = read_prompts(trial_cfg.prompts)
        if repr((trial_cfg.model, trial_cfg.gate, trial_cfg.prompts)) in gates:
            continue
        gates.add(repr((trial_cfg.model, trial_cfg.gate, trial_cfg.prompts)))
        shape = check_fits(trial_cfg, shapes)
        if trial_cfg.gate.readouts is not None and (trial_cfg.gate.readouts, shape, key) not in readouts:
            readouts.add((trial_cfg.gate.readouts, shape, key))  # with the prompts it is evaluated on: not its own
            check_readouts_file(trial_cfg.gate.readouts, "gate.readouts", shape, prompt_sets[key])


def _storage(cfg: Config, root: Path) -> Path:
    """Tune's storage resolved: ``sweep.storage``, else ``<results.root>/ray``, which must then resolve
    inside results.root (a link planted there would take Tune's files elsewhere)."""
    if cfg.sweep.storage is not None:
        return Path(cfg.sweep.storage).expanduser().resolve()
    return inside(root, root / "ray", key="results.root")


def base_overrides(overrides: list[str], run_id: str, root: Path) -> list[str]:
    """The command line's overrides, less the driver's own, plus this run's id and root."""
    from sweep.config.search import as_override

    kept = [o for o in overrides if override_key(o) not in DRIVER_KEYS]
    return [*kept, f"run_id={run_id}", as_override("results.root", str(root))]


def sweep_name(cfg: Config, storage: Path, run_id: str) -> str:
    if cfg.sweep.name is not None:
        if cfg.resume and not (storage / cfg.sweep.name).is_dir():
            raise ConfigError(f"sweep.name={cfg.sweep.name}: no sweep of that name under {storage} to resume")
        return cfg.sweep.name
    if not cfg.resume:
        return f"{cfg.search.name}-{run_id}"
    earlier = _earlier_sweeps(storage, cfg.search.name)
    if not earlier:
        raise ConfigError(
            f"resume=true: no earlier sweep of search={cfg.search.name} under {storage}; pass sweep.name=NAME"
        )
    return earlier[-1].name


def _earlier_sweeps(storage: Path, search_name: str) -> list[Path]:
    """The sweeps of ``search_name`` under ``storage``, oldest first (by their directory's mtime)."""
    if not storage.is_dir():
        return []
    return sorted(storage.glob(f"{search_name}-*"), key=lambda p: p.stat().st_mtime)


def select_trials(
    grid_trials: GridTrials | None, done: dict, device: str, root: str
) -> tuple[list[list[str]] | None, int]:
    """Grid trials still to run on ``device``: not already done, each trial id once; and how many settings were
    skipped as done, each trial id once too (a grid may list one setting twice: overlapping sub-spaces)."""
    if grid_trials is None:
        return None, 0
    todo, seen, skipped = [], set(), 0
    for trial, trial_cfg in grid_trials:
        tid = trial_identity(trial_cfg, device).id
        if tid in seen:
            continue
        seen.add(tid)
        if tid in done:
            skipped += 1
        else:
            todo.append(trial)
    if skipped:
        log.info("skipping %d settings whose rows exist under %s (sweep.rerun=true redoes them)", skipped, root)
    return todo, skipped


def done_settings(grid_trials: GridTrials | None, done: dict, device: str) -> list[dict]:
    """The rows, already done, of the grid's settings on ``device``: each once, in grid order (what a
    finished sweep run again shows); none for Optuna (its settings are sampled as it runs)."""
    rows, seen = [], set()
    for _, trial_cfg in grid_trials or []:
        tid = trial_identity(trial_cfg, device).id
        if tid in done and tid not in seen:
            seen.add(tid)
            rows.append(done[tid])
    return rows


def baseline_groups(grid_trials: GridTrials, todo: list[list[str]], size: int) -> list[list[list[str]]]:
    """The trials in ``todo`` bundled for ``sweep.shared_baseline``: at most ``size`` per bundle,
    each bundle's settings alike in everything but the gate, bench.kv_policy, bench.mode and
    bench.draft_len (so one full-depth baseline per round serves them all:
    ``sweep.bench.protocol.run_trials``), in planned order."""
    cfgs = {tuple(trial): c for trial, c in grid_trials}
    groups: dict[str, list[list[str]]] = {}
    for trial in todo:
        cfg = cfgs[tuple(trial)]
        bench = dataclasses.replace(cfg.bench, kv_policy="full", mode="early_exit", draft_len=1)
        groups.setdefault(repr(dataclasses.replace(cfg, gate=None, bench=bench)), []).append(trial)
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]
