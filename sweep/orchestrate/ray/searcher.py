"""Ray Tune's searcher for an Optuna sweep: OptunaSearch over the define-by-run space
(``sweep.orchestrate.searches.study``), whose study stands on its own (each trial's row identity, measured figures
and constraints where optuna-dashboard and Optuna's samplers read them) and whose trials are settings the sweep has
not measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from sweep.bench.estimators import skips_compute
from sweep.config import SearchConfig, override_key
from sweep.config.identity import trial_identity
from sweep.config.search import as_override, spaces
from sweep.errors import SweepError
from sweep.orchestrate.ray import internals as _ray_private
from sweep.orchestrate.report import ROW, row_of, trial_report
from sweep.orchestrate.searches import study as optuna_api
from sweep.orchestrate.searches.study import DefineByRun, StudySpec
from sweep.orchestrate.settings import row_setting_ids, setting_ids, trial_config


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
    another sweep's, and each row this run's trials report) is told to the study with that row's figures, one
    proposed earlier in this run that has no row (still running, or ended without one) is told failed
    (``repeat_of``), and the study is asked again, at random after ``MODEL_ASKS`` repeats (a model-based sampler
    keeps to its best guess), at most ``ASKS`` times (then the setting runs: its row is taken as any trial's whose
    row exists; the search then ends: each later ask is Tune's ``FINISHED``). A setting is what it runs: a draw of
    ``gate.min_depth`` that resolves to the layer of a setting measured or proposed already is that setting
    (``setting_ids``).
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
        self._ids: dict[tuple, tuple[str, ...]] = {}  # each proposal's ids, by its overrides
        self._shapes: dict = {}  # each model's depth, read once (``setting_ids``)
        self._known: dict[str, dict] = {}  # rows by trial id and by the setting they measured
        for row in (known or {}).values():
            self._remember(row)
        self._overrides: dict[str, list[str]] = {}
        self._proposed: dict[str, tuple] = {}  # this run's proposals (overrides), by trial id and setting id
        self.exhausted = False  # asked ASKS times without a setting left to measure: the search has finished
        self._told: set[str] = set()
        super().__init__(*args, **kwargs)

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.exhausted:  # the space has no setting left that the sweep has not measured or started
            return self.FINISHED
        study = _ray_private.optuna_study(self)
        sampler = study.sampler
        config = super().suggest(trial_id)
        try:
            for ask in range(self.ASKS + 1):
                ids = self._setting_ids(config)
                row = next((self._known[i] for i in ids if i in self._known), None)
                earlier = next((self._ids[self._proposed[i]][0] for i in ids if i in self._proposed), None)
                if row is None and earlier is None:
                    break
                if ask == self.ASKS:  # asked enough: this one runs as the setting it repeats, and no more are asked
                    self.exhausted = True
                    config = self._as_measured(config, row, earlier)
                    break
                ot_trial = _ray_private.take_optuna_trial(self, trial_id)
                if row is not None:  # measured already: the study learns its figures, the sweep runs it not again
                    ot_trial.set_user_attr("from_row", True)
                    self._tell(ot_trial, row)
                else:  # proposed earlier in this run, no row (still running, or none came): nothing to tell
                    ot_trial.set_user_attr("repeat_of", earlier)
                    optuna_api.tell_failed(study, ot_trial)
                if ask == self.MODEL_ASKS - 1:  # the sampler's model keeps to what it has: draw at random instead
                    study.sampler = optuna_api.sampler("random", self._random_seed + len(study.trials))
                config = super().suggest(trial_id)
        finally:
            study.sampler = sampler
        if config and "trial" in config:
            self._overrides[trial_id] = list(config["trial"])
            ids = self._setting_ids(config)
            for i in ids:
                self._proposed.setdefault(i, tuple(config["trial"]))
        return config

    def _setting_ids(self, config: dict | None) -> tuple[str, ...]:
        """A proposal's (``config["trial"]``: its overrides) trial id as the driver composes it and the id of the
        setting it runs, its ``gate.min_depth`` keyed by the layer it resolves to (``setting_ids``: draws of
        min_depth 0.3 and 0.31 of a 4-layer model are one setting); none when it does not compose (its worker reports
        it failed) or there is none."""
        if not config or "trial" not in config or self._device is None:
            return ()
        trial = tuple(config["trial"])
        if trial not in self._ids:  # composed once per proposal (a categorical space proposes the same one often)
            self._ids[trial] = setting_ids(self._base, list(trial), self._device, self._shapes) or ()
        return self._ids[trial]

    def _remember(self, row: dict) -> None:
        """A row measured (this run's, a resumed study's or another sweep's), by its trial id and the setting it
        measured; an ok row kept over a failed one of the same setting."""
        for setting in row_setting_ids(row):
            if setting not in self._known or self._known[setting].get("status") != "ok":
                self._known[setting] = row

    def _as_measured(self, config: dict, row: dict | None, earlier: str | None) -> dict:
        """A proposal of a setting measured already (``row``) or proposed earlier in this run (``earlier``, its trial
        id), given as that setting was, so that its worker finds that setting's row by its trial id and reports it
        rather than measuring the setting again (a draw of ``gate.min_depth`` 0.31 where 0.3's row exists); as
        proposed where neither can be rebuilt."""
        if row is None:
            return {**config, "trial": list(self._proposed[earlier])} if earlier in self._proposed else config
        try:
            gate = json.loads(row["trial_key"])["gate"]
        except (KeyError, TypeError, ValueError):  # a key that does not read
            return config
        key = "min_depth" if gate.get("min_depth") is not None else "min_layer"
        trial = [o for o in config["trial"] if override_key(o) not in ("gate.min_depth", "gate.min_layer")]
        trial.append(as_override(f"gate.{key}", gate.get(key)))
        ids = setting_ids(self._base, trial, self._device, self._shapes)
        return {**config, "trial": trial} if ids and ids[0] == row.get("trial_id") else config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing: a trial reports once, and the study has no pruner (OptunaSearch would
        report the objective as an intermediate value, None for a failed trial)."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = _ray_private.optuna_trial(self, trial_id)
        row = _row(result)
        if row.get("trial_id") is not None:  # measured now: proposed again, the study learns its figures from the row
            self._remember(row)
        if ot_trial is not None and trial_id not in self._told:
            self._told.add(trial_id)
            result, error = self._record(ot_trial, self._row_attrs(trial_id, result, error), result, error)
        super().on_trial_complete(trial_id, result=result, error=error)

    def _tell(self, ot_trial, row: dict) -> None:
        """Tell the study a setting it proposed again, with the figures of the row it already has (as
        ``on_trial_complete`` tells a trial that ran)."""
        result = trial_report(row, 0, cached=True)
        result, _ = self._record(ot_trial, self._row_attrs("", result, False), result, False)
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [result[m] for m in metrics] if result else None
        study = _ray_private.optuna_study(self)
        if values is None or None in values:
            optuna_api.tell_failed(study, ot_trial)
        else:
            study.tell(ot_trial, values if len(values) > 1 else values[0])

    def _record(self, ot_trial, attrs: dict, result: dict | None, error: bool) -> tuple[dict | None, bool]:
        """A finished trial's user attributes (``attrs``: its row identity), measured figures and constraints set
        on ``ot_trial``; the result and error to tell the study (a trial that is not ok is failed)."""
        for key, value in attrs.items():
            ot_trial.set_user_attr(key, value)
        if result and result.get("status") != "ok":
            return None, True
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        unmeasured = [m for m in dict.fromkeys([*metrics, *self._bounds]) if result and result.get(m) is None]
        if unmeasured:  # an ok row without a figure the study reads: a task side stopped under its loss bar
            ot_trial.set_user_attr("error", _unmeasured(unmeasured, _row(result)))
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
        row = _row(result) or None
        if row is not None:
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


ROW_ATTRS = ("trial_id", "gate", "model", "status")  # user attributes every trial carries (from its row)
MEASURED_ATTRS = {  # user attribute: the row's column, beside the ranked objective
    "speedup_wall_measured": "speedup_wall",
    "speedup_aa": "speedup_aa",
    "noise_floor": "noise_floor",
}


def _row(result: dict | None) -> dict:
    """The row a result carries: nested, as the worker reported it, or flattened, as Tune hands a result to its
    searcher (``row/<column>``)."""
    row = row_of(result)
    if row is None:
        prefix = f"{ROW}/"
        row = {k[len(prefix) :]: v for k, v in (result or {}).items() if k.startswith(prefix)}
    return row


def _measured_attrs(result: dict) -> dict[str, Any]:
    """An ok trial's measured figures beside its objective: the raw speedup_wall ratio (the objective is the
    ranked one), its A/A control and noise floor, and whether it skipped compute."""
    row = _row(result)
    attrs = {key: float(row[col]) for key, col in MEASURED_ATTRS.items() if row.get(col) is not None}
    return {**attrs, "skipped_compute": _skipped(result)}


def _unmeasured(metrics: list[str], row: dict) -> str:
    """Why the study is told a trial with an ok row failed: the figures it reads that the row does not hold."""
    why = (
        f"its task stopped once its accuracy loss was certain to be >= {row['accuracy_loss_min']:.3f} "
        "(search.max_accuracy_loss)"
        if row.get("accuracy_loss_min") is not None
        else "not measured"
    )
    return f"no {', '.join(metrics)} in its row: {why}"


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


def searcher(spec: StudySpec, max_concurrent: int | None = None):
    """Ray Tune's searcher for a sampled search (``Search.searcher``'s spec), at most ``max_concurrent`` trials
    at once (sweep.max_concurrent)."""
    found = optuna_search(spec.search, spec.path, base=spec.base, device=spec.device, root=spec.root, known=spec.known)
    return found if max_concurrent is None else ConcurrencyLimiter(found, max_concurrent=max_concurrent)


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
    metrics = list(search.objectives)
    modes = [search.objectives[m] for m in metrics]
    storage, held = optuna_api.opened(search, path, root)
    return ConstrainedOptunaSearch(
        constraints=dict(search.constraints),
        base=base,
        device=device,
        known=known,
        random_seed=search.seed,
        space=DefineByRun(spaces(search)),
        metric=metrics if len(metrics) > 1 else metrics[0],
        mode=modes if len(modes) > 1 else modes[0],
        sampler=optuna_api.sampler(search.sampler, search.seed + held),
        study_name=search.name,
        storage=storage,
    )
