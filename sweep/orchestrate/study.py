"""The Optuna side of a sweep: the search space as Optuna parameters, the searcher Ray Tune
drives, and the study it persists in SQLite beside Tune's experiment.

The study stands on its own (README, "Sweeps"): metric names, readable parameter names,
every trial's row identity (``trial_id``, the join key with the Parquet ``trials`` table)
and its constraints where optuna-dashboard reads them. A resume reads the study as data
(``remaining_trials``); nothing here unpickles a file.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import optuna
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from sweep.orchestrate import ray_internals as _ray_private
from sweep.config import SearchConfig
from sweep.errors import ConfigError, SweepError
from sweep.bench.estimators import row_speedup, skips_compute
from sweep.config.identity import trial_identity
from sweep.orchestrate.settings import trial_config
from sweep.config.search import METRICS, Param, as_override, spaces


def distributions(param: Param) -> tuple[Any, Any]:
    """One parameter as (Ray Tune domain, Optuna distribution): the single mapping function."""
    if param.kind == "fixed":
        return param.values[0], optuna.distributions.CategoricalDistribution(list(param.values))
    if param.kind == "choice":
        return tune.choice(list(param.values)), optuna.distributions.CategoricalDistribution(list(param.values))
    if param.integer:
        low, high = int(param.low), int(param.high)
        domain = tune.lograndint(low, high + 1) if param.log else tune.randint(low, high + 1)
        return domain, optuna.distributions.IntDistribution(low, high, log=param.log)
    domain = tune.loguniform(param.low, param.high) if param.log else tune.uniform(param.low, param.high)
    return domain, optuna.distributions.FloatDistribution(float(param.low), float(param.high), log=param.log)


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
                seen.setdefault(param.key, []).append(distributions(param)[1])
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
        index = 0
        if len(self.subspaces) > 1:
            index = self.labels.index(trial.suggest_categorical(SUBSPACE, self.labels))
        overrides = []
        for param in self.subspaces[index]:
            if param.kind == "fixed":
                overrides.append(as_override(param.key, param.values[0]))
                continue
            _, dist = distributions(param)
            name = self.names[index][param.key]
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                value = trial.suggest_categorical(name, list(dist.choices))
            elif isinstance(dist, optuna.distributions.IntDistribution):
                value = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
            else:
                value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
            overrides.append(as_override(param.key, value))
        return {"trial": overrides}


def optuna_storage_url(path: Path) -> str:
    return f"sqlite:///{path / 'optuna.db'}"


def remaining_trials(search: SearchConfig, path: Path, *, rows: set[str]) -> int:
    """Trials an interrupted or extended Optuna sweep still has to run: ``n_trials`` (distinct settings) less the
    distinct settings of the study's finished trials whose row exists (``rows``: the trial ids with a row under
    results.root). A study trial
    without its row (the interruption left it running, the sweep stopped before it ran, or its row
    was never written) is not done: its parameters are enqueued, so the resume runs that setting
    again, once. Trials left running are marked failed (no worker will finish them). The study
    is SQLite rows, read as data; one that cannot be read is a ConfigError naming the file."""
    from optuna.trial import TrialState

    if not (path / "optuna.db").is_file():
        return search.n_trials
    study = _open_study(search, path)
    if study is None:  # no study of that name yet
        return search.n_trials
    with _reading(path):
        trials = study.get_trials(deepcopy=False)
        waiting = [t.params for t in trials if t.state == TrialState.WAITING]
        done, lost = set(), []
        for trial in trials:
            if trial.state == TrialState.RUNNING:
                study.tell(trial.number, state=TrialState.FAIL)
            elif trial.state != TrialState.WAITING and trial.user_attrs.get("trial_id") in rows:
                done.add(trial.user_attrs["trial_id"])  # a setting counts once, however often it was proposed
                continue
            if trial.user_attrs.get("repeat_of"):  # a proposal told failed because it repeated one: not lost
                continue
            if trial.state != TrialState.WAITING and trial.params and trial.params not in waiting + lost:
                lost.append(trial.params)
        remaining = max(search.n_trials - len(done), 0)
        for params in lost[: max(remaining - len(waiting), 0)]:
            study.enqueue_trial(params)
    return remaining


def _open_study(search: SearchConfig, path: Path):
    """The sweep's study in ``path/optuna.db``, or None when it holds no study of that name."""
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


class ConstrainedOptunaSearch(OptunaSearch):
    """OptunaSearch whose study stands on its own (README, "Sweeps"): on each finished trial it
    records the trial's row identity as user attributes (``trial_id``, the join key with the
    Parquet ``trials`` table, ``gate``, ``model``, ``status``; ``error`` for failed trials) and
    its measured figures beside the ranked objective (``speedup_wall_measured``, ``speedup_aa``,
    ``noise_floor``, ``skipped_compute``), sets its constraints (``metric >= bound`` as
    ``bound - metric <= 0``, with each constrained metric as a user attribute, then
    ``skipped_compute``: 0 where the trial skipped compute, else 1, infeasible, so a trial that
    is not early exit is never the study's best), and tells the study that a trial which is not
    ``ok`` failed (rather than leaving it running).

    ``base`` and ``device``: how the driver composes a trial's config, for the identity of a trial whose worker died
    before it reported a row (as ``RowWriter.errored`` does), and of every proposal. Each Tune trial is a setting
    the sweep has not measured: a proposal with a row already (``known``: rows by trial id, a resumed study's or
    another sweep's) is told to the study with that row's figures, one proposed earlier in this run is told failed
    (``repeat_of``), and the study is asked again, at random after ``MODEL_ASKS`` repeats (a model-based sampler
    keeps to its best guess), at most ``ASKS`` times (then the setting runs: its row is taken as any trial's whose
    row exists).
    """

    ASKS = 50
    MODEL_ASKS = 2  # repeats the sampler may propose before the next proposals are drawn at random

    def __init__(
        self,
        *args,
        constraints: dict[str, float] | None = None,
        base: list[str] = (),
        device: str | None = None,
        known: dict[str, dict] | None = None,
        random_seed: int = 0,
        **kwargs,
    ) -> None:
        self._random_seed = random_seed
        self._bounds = dict(constraints or {})
        self._base, self._device = list(base), device
        self._known = dict(known or {})
        self._overrides: dict[str, list[str]] = {}
        self._proposed: set[str] = set()
        self._told: set[str] = set()
        super().__init__(*args, **kwargs)

    def suggest(self, trial_id: str) -> dict | None:
        study = _ray_private.optuna_study(self)
        sampler = study.sampler
        config = super().suggest(trial_id)
        try:
            for ask in range(self.ASKS):
                setting = self._setting_id(config)
                if setting is None or (setting not in self._known and setting not in self._proposed):
                    break
                ot_trial = _ray_private.take_optuna_trial(self, trial_id)
                if (
                    setting in self._known
                ):  # measured already: the study learns its figures, the sweep runs it not again
                    ot_trial.set_user_attr("from_row", True)
                    self._tell(ot_trial, self._known[setting])
                else:  # proposed earlier in this run, still running: nothing to tell of it yet
                    ot_trial.set_user_attr("repeat_of", setting)
                    study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
                if ask == self.MODEL_ASKS - 1:  # the sampler's model keeps to what it has: draw at random instead
                    study.sampler = optuna.samplers.RandomSampler(seed=self._random_seed + len(study.trials))
                config = super().suggest(trial_id)
        finally:
            study.sampler = sampler
        if config and "trial" in config:
            self._overrides[trial_id] = list(config["trial"])
            if setting is not None:
                self._proposed.add(setting)
        return config

    def _setting_id(self, config: dict | None) -> str | None:
        """The trial id of a proposal (``config["trial"]``: its overrides) as the driver composes it; None when it
        does not compose (its worker reports it failed) or there is none."""
        if not config or "trial" not in config or self._device is None:
            return None
        try:
            return trial_identity(trial_config(self._base, list(config["trial"]), self._device), self._device).id
        except SweepError:
            return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing: a trial reports once, and the study has no pruner (OptunaSearch would
        report the objective as an intermediate value, None for a failed trial)."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = _ray_private.optuna_trial(self, trial_id)
        if ot_trial is not None and trial_id not in self._told:
            self._told.add(trial_id)
            result, error = self._record(ot_trial, self._row_attrs(trial_id, result, error), result, error)
        super().on_trial_complete(trial_id, result=result, error=error)

    def _tell(self, ot_trial, row: dict) -> None:
        """Tell the study a setting it proposed again, with the figures of the row it already has (as
        ``on_trial_complete`` tells a trial that ran)."""
        result = {**reported_metrics(row), "row_json": json.dumps(row, default=str)}
        result, _ = self._record(ot_trial, self._row_attrs("", result, False), result, False)
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [result[m] for m in metrics] if result else None
        study = _ray_private.optuna_study(self)
        if values is None or None in values:
            study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(ot_trial, values if len(values) > 1 else values[0])

    def _record(self, ot_trial, attrs: dict, result: dict | None, error: bool) -> tuple[dict | None, bool]:
        """A finished trial's user attributes (``attrs``: its row identity), measured figures and constraints set
        on ``ot_trial``; the result and error to tell the study (a trial that is not ok is failed)."""
        for key, value in attrs.items():
            ot_trial.set_user_attr(key, value)
        if result and result.get("status") != "ok":
            return None, True
        if result:
            for key, value in _measured_attrs(result).items():
                ot_trial.set_user_attr(key, value)
            for metric in self._bounds:
                ot_trial.set_user_attr(metric, float(result[metric]))
            bounds = [float(b) - float(result[m]) for m, b in self._bounds.items()]
            set_constraints(ot_trial, [*bounds, 0.0 if _skipped(result) else 1.0])
        return result, error

    def _row_attrs(self, trial_id: str, result: dict | None, error: bool) -> dict[str, Any]:
        """The trial's row identity: from the row its worker reported, else (no row: its config
        failed to compose, its worker died, or Tune stopped it before it ran) as much as the
        driver can compose."""
        if result and "row_json" in result:
            row = json.loads(result["row_json"])
            attrs = {key: row[key] for key in ROW_ATTRS if row.get(key) is not None}
            if row.get("status") == "failed":
                attrs["error"] = str(row.get("error"))[:500]
        elif result:
            attrs = {"status": "failed", "error": str(result.get("error"))[:500]}
        elif error:
            attrs = {"status": "failed", "error": "the trial's worker failed more than sweep.max_failures times"}
        else:  # removed before it ran (the sweep was stopped): Optuna marks it pruned
            attrs = {"status": "not run"}
        if not set(ROW_ATTRS) <= set(attrs):
            attrs = {**self._composed(trial_id), **attrs}
        return attrs

    def _composed(self, trial_id: str) -> dict[str, str]:
        """A trial's id, gate and model as the driver composes its config (``RowWriter.errored``
        does the same), or nothing when it does not compose."""
        overrides = self._overrides.get(trial_id)
        if overrides is None or self._device is None:
            return {}
        try:
            cfg = trial_config(self._base, overrides, self._device)
        except SweepError:
            return {}
        return {"trial_id": trial_identity(cfg, self._device).id, "gate": cfg.gate.name, "model": cfg.model.name}


def reported_metrics(row: dict) -> dict:
    """What the searcher sees: objectives of ok trials; None for others (Optuna marks them failed).
    ``speedup_wall`` is the ranked speedup the analysis ranks by (``sweep.bench.estimators.row_speedup``:
    capped at 1.0 from above where no compute was skipped, 1.0 inside the trial's A/A noise floor);
    the study keeps the measured ratio as a user attribute (``sweep.orchestrate.study``)."""
    ok = row.get("status") == "ok"
    metrics = {m: (row.get(m) if ok else None) for m in METRICS}
    if ok:
        metrics["speedup_wall"] = row_speedup(row, "speedup_wall")
    return {"status": row.get("status"), **metrics}


ROW_ATTRS = ("trial_id", "gate", "model", "status")  # user attributes every trial carries (from its row)
SKIP_CONSTRAINT = "skipped_compute"  # the last constraint of every trial: one that skipped no compute is infeasible
MEASURED_ATTRS = {  # user attribute: the row's column, beside the ranked objective
    "speedup_wall_measured": "speedup_wall",
    "speedup_aa": "speedup_aa",
    "noise_floor": "noise_floor",
}


def _row(result: dict) -> dict:
    return json.loads(result["row_json"]) if "row_json" in result else {}


def _measured_attrs(result: dict) -> dict[str, Any]:
    """An ok trial's measured figures beside its objective: the raw speedup_wall ratio (the objective is the
    ranked one), its A/A control and noise floor, and whether it skipped compute."""
    row = _row(result)
    attrs = {key: float(row[col]) for key, col in MEASURED_ATTRS.items() if row.get(col) is not None}
    return {**attrs, "skipped_compute": _skipped(result)}


def _skipped(result: dict) -> bool:
    """Whether the trial skipped decoder-layer work (``sweep.bench.estimators.skips_compute`` of its row)."""
    row = _row(result)
    return skips_compute(row.get("mode"), row.get("step_layers_saved"), row.get("exit_rate"), row.get("kv_policy"))


def set_constraints(trial, values: list[float]) -> None:
    """A trial's constraint values (feasible when every one is <= 0), in Optuna's list format:
    the trial system attribute ``constraints``, the one optuna-dashboard reads (its
    ``_serializer.serialize_frozen_trial``: ``system_attrs.get("constraints", [])``) and one
    that Optuna's samplers read (``FrozenTrial.constraints``, which TPE and NSGA-II use, reads
    it as keys ``"0"``, ``"1"``, ...). ``Trial.set_constraint`` writes ``constraints:<name>``
    keys instead, which optuna-dashboard does not show. The list's order is the study user
    attribute ``constraints``. Optuna-private (``_trial_id``): the same call Optuna's own
    ``constraints_func`` handling makes."""
    _ray_private.set_trial_system_attr(trial, CONSTRAINTS_KEY, [float(v) for v in values])


CONSTRAINTS_KEY = "constraints"


def optuna_search(
    search: SearchConfig,
    path: Path,
    *,
    base: list[str] = (),
    device: str | None = None,
    root: Path | None = None,
    known: dict[str, dict] | None = None,
) -> ConstrainedOptunaSearch:
    """OptunaSearch over the define-by-run space, its study persisted in SQLite and described there
    (``describe_study``). Seeded: ``search.seed``, plus the trials a resumed study already holds, so a resume never
    restarts the sampler onto the stream that drew them. ``known``: rows by trial id, told to the study when it
    proposes their settings again (``ConstrainedOptunaSearch``)."""
    samplers = {
        "tpe": optuna.samplers.TPESampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "random": optuna.samplers.RandomSampler,
    }
    path.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = list(search.objectives)
    modes = [search.objectives[m] for m in metrics]
    with _reading(path):
        storage = optuna.storages.RDBStorage(optuna_storage_url(path))
        held = len(describe_study(search, storage, root).get_trials(deepcopy=False))
    sampler = samplers[search.sampler](seed=search.seed + held)
    return ConstrainedOptunaSearch(
        constraints=dict(search.constraints),
        base=base,
        device=device,
        known=known,
        random_seed=search.seed,
        space=DefineByRun(spaces(search)),
        metric=metrics if len(metrics) > 1 else metrics[0],
        mode=modes if len(modes) > 1 else modes[0],
        sampler=sampler,
        study_name=search.name,
        storage=storage,
    )


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
        "speedup_wall is the ranked speedup the analysis ranks by (sweep.bench.estimators.ranked_speedup): the "
        "measured "
        "ratio capped at 1.0 from above where the trial skipped no compute, and 1.0 inside its A/A noise floor; the "
        "measured ratio is the user attribute speedup_wall_measured. A trial that skipped no compute is infeasible "
        "(constraint skipped_compute), so it is never the study's best.",
    )
    if len(spaces(search)) > 1:
        study.set_user_attr("subspaces", subspace_labels(spaces(search)))
    if root is not None:
        study.set_user_attr("trials_table", str(Path(root) / "trials"))
    return study
