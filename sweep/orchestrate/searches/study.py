"""The Optuna side of a sweep: the search space as Optuna parameters, the searcher Ray Tune
drives, and the study it persists in SQLite beside Tune's experiment.

The study stands on its own (README, "Sweeps"): metric names, readable parameter names,
every trial's row identity (``trial_id``, the join key with the Parquet ``trials`` table)
and its constraints where optuna-dashboard reads them. A resume reads the study as data
(``remaining_trials``); nothing here unpickles a file.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna import Study
from optuna.trial import FrozenTrial, TrialState

from sweep.config import SearchConfig
from sweep.errors import ConfigError
from sweep.config.search import Param, setting_override, spaces

SAMPLERS = {
    "tpe": optuna.samplers.TPESampler,
    "nsga2": optuna.samplers.NSGAIISampler,
    "random": optuna.samplers.RandomSampler,
}


@dataclass(frozen=True)
class StudySpec:
    """What a sampled search hands the driver for Ray Tune's searcher (``Search.searcher``): its settings, the
    sweep's directory (its study in ``optuna.db`` there), how the driver composes a trial (``base``, ``device``),
    the results root and the rows already measured, by trial id (``known``)."""

    search: SearchConfig
    path: Path
    base: list[str]
    device: str
    root: Path | None = None
    known: dict[str, dict] = field(default_factory=dict)


def distribution(param: Param):
    """One sampled parameter as an Optuna distribution."""
    if param.kind in ("fixed", "choice"):
        return optuna.distributions.CategoricalDistribution(list(param.values))
    if param.integer:
        return optuna.distributions.IntDistribution(int(param.low), int(param.high), log=param.log)
    return optuna.distributions.FloatDistribution(float(param.low), float(param.high), log=param.log)


def sampler(name: str, seed: int):
    """Optuna's sampler ``name`` (``SAMPLERS``), seeded."""
    return SAMPLERS[name](seed=seed)


def tell_failed(study: Study, trial) -> None:
    """Tell the study that ``trial`` failed."""
    study.tell(trial, state=TrialState.FAIL)


def new_study(name: str, storage: str | None, direction: str, load_if_exists: bool) -> Study:
    """A single-objective study (the skip-set screen's), or the one of that name ``storage`` holds."""
    return optuna.create_study(storage=storage, study_name=name, direction=direction, load_if_exists=load_if_exists)


def complete_trials(study: Study) -> list[FrozenTrial]:
    """The study's complete trials."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def fixed_setting(space: DefineByRun, params: dict) -> list[str]:
    """The overrides ``space`` gives a trial with these parameters."""
    return space(optuna.trial.FixedTrial(params))["trial"]


def opened(search: SearchConfig, path: Path, root: Path | None = None):
    """The sweep's study storage in ``path`` (made), described (``describe_study``), and how many trials it holds."""
    path.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with _reading(path):
        storage = optuna.storages.RDBStorage(optuna_storage_url(path))
        held = len(describe_study(search, storage, root).get_trials(deepcopy=False))
    return storage, held


def best_trials(study: Study) -> list[FrozenTrial]:
    """The trials a study ends with: its Pareto set (or best) among the complete trials whose constraints are all
    met (``constraints`` <= 0, as the study records them), each setting once."""
    feasible = [t for t in complete_trials(study) if all(c <= 0 for c in t.system_attrs.get("constraints", []))]
    best, seen = [], set()
    for t in feasible:
        dominated = any(_dominates(o.values, t.values, study.directions) for o in feasible if o is not t)
        if not dominated and t.user_attrs.get("trial_id") not in seen:
            seen.add(t.user_attrs.get("trial_id"))
            best.append(t)
    return best


def _dominates(a: list[float], b: list[float], directions) -> bool:
    sign = [1.0 if d == optuna.study.StudyDirection.MAXIMIZE else -1.0 for d in directions]
    better = [s * x >= s * y for s, x, y in zip(sign, a, b)]
    return all(better) and any(s * x > s * y for s, x, y in zip(sign, a, b))


SKIP_CONSTRAINT = "skipped_compute"  # the last constraint of every trial: one that skipped no compute is infeasible
SUBSPACE = "subspace"  # the Optuna parameter that picks a sub-space (its choices: the sub-spaces' labels)


def subspace_labels(subspaces: list[list[Param]]) -> list[str]:
    """A readable, unique label per sub-space: its gate (``margin``), else ``space<i>``;
    ``<gate>#<i>`` where several sub-spaces fix the same gate."""
    names = []
    for i, params in enumerate(subspaces):
        gate = next((p for p in params if p.key == "gate" and p.kind == "fixed"), None)
        names.append(str(gate.values[0]) if gate is not None else f"space{i}")
    return [name if names.count(name) == 1 else f"{name}#{i}" for i, name in enumerate(names)]


def param_names(subspaces: list[list[Param]], labels: list[str]) -> list[dict[str, str]]:
    """The Optuna parameter name of each sampled parameter, per sub-space: its config path
    (``gate.min_depth``) where every sub-space that samples it gives it the same distribution
    (one name, one distribution, shared by the sampler), else ``<label>/<path>``
    (``margin/gate.theta``), so a name never changes distribution within a study."""
    seen: dict[str, list] = {}
    for params in subspaces:
        for param in params:
            if param.kind != "fixed":
                seen.setdefault(param.key, []).append(distribution(param))
    shared = {key for key, dists in seen.items() if all(d == dists[0] for d in dists)}
    return [
        {p.key: p.key if p.key in shared else f"{label}/{p.key}" for p in params if p.kind != "fixed"}
        for params, label in zip(subspaces, labels)
    ]


class DefineByRun:
    """An Optuna define-by-run space: pick a sub-space (parameter ``subspace``, by label),
    then suggest its parameters under readable names (``param_names``).

    A class rather than a closure: Tune pickles the searcher into its experiment state.
    """

    def __init__(self, subspaces: list[list[Param]]) -> None:
        self.subspaces = subspaces
        self.labels = subspace_labels(subspaces)
        self.names = param_names(subspaces, self.labels)

    def __call__(self, trial) -> dict:
        """A setting's overrides; its paths as read here (``setting_override``: a worker composes them elsewhere)."""
        index = 0
        if len(self.subspaces) > 1:
            index = self.labels.index(trial.suggest_categorical(SUBSPACE, self.labels))
        overrides = []
        for param in self.subspaces[index]:
            if param.kind == "fixed":
                overrides.append(setting_override(param.key, param.values[0]))
                continue
            dist = distribution(param)
            name = self.names[index][param.key]
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                value = trial.suggest_categorical(name, list(dist.choices))
            elif isinstance(dist, optuna.distributions.IntDistribution):
                value = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
            else:
                value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
            overrides.append(setting_override(param.key, value))
        return {"trial": overrides}


def optuna_storage_url(path: Path) -> str:
    return f"sqlite:///{study_file(path)}"


def study_written(path: Path) -> bool:
    """Whether the sweep in ``path`` has its study file (a regular file, not a link): a plain re-run of the same
    definition continues that sweep (``Search.continues``), finished or not."""
    import os

    db = path / "optuna.db"
    return os.path.isfile(db) and not os.path.islink(db)


def study_file(path: Path) -> Path:
    """The sweep's study file, refused in one line when something that is not a regular file is in its place (SQLite
    would wait forever on a FIFO)."""
    import os
    import stat

    from sweep.errors import ConfigError

    db = path / "optuna.db"
    try:
        mode = os.stat(db).st_mode
    except FileNotFoundError:
        return db
    except OSError as exc:
        raise ConfigError(f"{db}: the sweep's Optuna study cannot be checked ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{db}: not a regular file (planted in place of the sweep's Optuna study); remove it")
    return db


def remaining_trials(
    search: SearchConfig,
    path: Path,
    *,
    rows: set[str],
    own: set[str] = frozenset(),
    identify: Callable[[dict], str | None] | None = None,
) -> int:
    """Trials an interrupted or extended Optuna sweep still has to run: ``n_trials`` (distinct settings) less the
    distinct settings of the study's finished trials whose row exists (``rows``: the trial ids with a row under
    results.root), those told from a row it found (``from_row``: an earlier run's or another sweep's) not among
    them, as a run that is not interrupted spends no Tune sample on them. A study trial
    without its row (the interruption left it running, the sweep stopped before it ran, or its row
    was never written) is not done: its parameters are enqueued, so the resume runs that setting
    again, once. Trials left running are marked failed (no worker will finish them). The study
    is SQLite rows, read as data; one that cannot be read is a ConfigError naming the file. Without a study (it was
    moved away), the sweep's own rows (``own``: their trial ids) are its finished trials: the fresh study learns
    them as the sampler proposes them again, and only the settings they lack are drawn. A trial the interruption
    ended before its trial id was recorded is known by its parameters (``identify``: parameters -> trial id), so
    the row its setting wrote as the sweep stopped counts."""
    study = open_study(search, path) if study_file(path).exists() else None
    if study is None:  # no study of that name (yet, or any more)
        return max(search.n_trials - len(own), 0)
    with _reading(path):
        trials = study.get_trials(deepcopy=False)
        waiting = [t.params for t in trials if t.state == TrialState.WAITING]
        done, lost = set(), []
        for trial in trials:
            tid = trial.user_attrs.get("trial_id")
            if tid is None and identify is not None and trial.params and trial.state != TrialState.WAITING:
                tid = identify(trial.params)
            if trial.state == TrialState.RUNNING:  # no worker will finish it; its setting may have its row
                _interrupted(study, trial, tid)
            if trial.state != TrialState.WAITING:
                if tid in rows and trial.user_attrs.get("from_row"):
                    continue  # a row the sweep found, not one it measured: it uses no sample, as in one run
                if tid in rows:
                    done.add(tid)  # a setting counts once, however often it was proposed
                    continue
            if trial.user_attrs.get("repeat_of"):  # a proposal told failed because it repeated one: not lost
                continue
            if trial.state != TrialState.WAITING and trial.params and trial.params not in waiting + lost:
                lost.append(trial.params)
        remaining = max(search.n_trials - len(done), 0)
        for params in lost[: max(remaining - len(waiting), 0)]:
            study.enqueue_trial(params)
    return remaining


def _interrupted(study, trial, tid: str | None) -> None:
    """A trial the sweep's stop left running, told failed with the user attributes every trial carries (its
    ``trial_id`` as its parameters compose, ``status`` ``interrupted``, and why), so that a reader of the study
    sees what it was."""
    running = optuna.trial.Trial(study, trial._trial_id)
    if tid is not None and "trial_id" not in trial.user_attrs:
        running.set_user_attr("trial_id", tid)
    running.set_user_attr("status", "interrupted")
    running.set_user_attr("error", "the sweep stopped while it ran; a resume runs its setting unless its row exists")
    study.tell(trial.number, state=TrialState.FAIL)


def open_study(search: SearchConfig, path: Path):
    """The sweep's study in ``path/optuna.db``, or None when it holds no study of that name (or no file)."""
    if not study_file(path).exists():
        return None
    with _reading(path):
        storage = optuna.storages.RDBStorage(optuna_storage_url(path))
        try:
            return optuna.load_study(study_name=search.name, storage=storage)
        except KeyError:
            return None


@contextlib.contextmanager
def _reading(path: Path):
    """A study file that cannot be read (truncated, garbage, tables dropped) is one line naming it,
    with the way out, rather than the database driver's error."""
    try:
        yield
    except (ConfigError, KeyError):
        raise
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy, sqlite3 and Optuna each raise their own kinds
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"{path / 'optuna.db'}: the sweep's Optuna study cannot be read ({type(exc).__name__}: {first}); move "
            "the file away and resume (a fresh study: trials whose rows exist are taken from their rows, not run "
            "again), or start a new sweep without resume=true"
        ) from None


def describe_study(search: SearchConfig, storage, root: Path | None = None) -> optuna.Study:
    """Create (or load, on resume) the sweep's study and name what it holds: its metric names
    (the objectives), and user attributes ``objectives``, ``constraints`` (in the order of each
    trial's ``constraints`` values: ``"agreement >= 0.98"`` is ``0.98 - agreement``),
    ``subspaces`` (the labels of the ``subspace`` parameter) and ``trials_table`` (the Parquet
    rows, joined on each trial's ``trial_id`` user attribute)."""
    metrics = list(search.objectives)
    directions = ["maximize" if search.objectives[m] == "max" else "minimize" for m in metrics]
    study = optuna.create_study(storage=storage, study_name=search.name, directions=directions, load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(
            f"search.objectives={search.objectives}: the study {search.name} in {storage.url} has directions "
            f"{[d.name.lower() for d in study.directions]}; resume it with the objectives it was created with"
        )
    with warnings.catch_warnings():  # experimental since Optuna 3.2, and what trials_dataframe and the dashboard read
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(metrics)
    study.set_user_attr("objectives", dict(search.objectives))
    study.set_user_attr("constraints", [*(f"{m} >= {b}" for m, b in search.constraints.items()), SKIP_CONSTRAINT])
    study.set_user_attr(
        "objective_speedup",
        "speedup_model is the cost model's speedup: the trial's own exits priced by costs measured on this machine, "
        "deterministic for given exits, so the study has a landscape to climb where wall-clock ratios lie inside "
        "their noise floors. speedup_wall is the ranked speedup the analysis ranks by "
        "(sweep.bench.estimators.ranked_speedup: the measured ratio capped at 1.0 from above where the trial skipped "
        "no compute, and 1.0 inside its A/A noise floor); the measured ratio is the user attribute "
        "speedup_wall_measured. The study's best settings are re-timed to analysis.floor_target before they rank. A "
        "trial that skipped no compute is infeasible (constraint skipped_compute), so it is never the study's best.",
    )
    if len(spaces(search)) > 1:
        study.set_user_attr("subspaces", subspace_labels(spaces(search)))
    if root is not None:
        study.set_user_attr("trials_table", str(Path(root) / "trials"))
    return study
