"""`kind: optuna`: Optuna, seeded, as Ray Tune's searcher over the sub-spaces (its study in SQLite beside the
sweep: ``sweep.orchestrate.searches.study``)."""

from __future__ import annotations

from sweep.config import compose
from sweep.config.search import as_override, spaces
from sweep.config.search_kinds import OptunaSettings
from sweep.orchestrate.done import row_ids, sweep_rows
from sweep.orchestrate.settings import merge
from sweep.orchestrate.searches.base import Search, register

MAX_ROUNDS = 64  # timed rounds a re-timed setting gets at most (a floor the offset alone keeps above the target)


def done_rows(root) -> dict[str, dict]:
    """Every row under ``root`` by trial id (its round timings included)."""
    from sweep.store import scan, trusted_rows

    return {r["trial_id"]: r for r in trusted_rows(scan("trials", root).collect(), root).iter_rows(named=True)}


@register
class Optuna(Search):
    settings = OptunaSettings
    summary = "search.n_trials settings drawn by Optuna (seeded) from search.spaces, intervals included"
    samples = True

    def foresee(self, cfg, base):
        """Both ends of every interval and every choice composed: a bad value fails before Ray starts."""
        for params in spaces(cfg.search):
            fixed = [as_override(p.key, p.values[0]) for p in params if p.kind == "fixed"]
            for p in params:
                values = p.values if p.kind == "choice" else (p.low, p.high) if p.kind == "interval" else ()
                for value in values:
                    compose(merge(base, [*fixed, as_override(p.key, value)]))
        return None

    def continues(self, root, path) -> bool:
        """A plain re-run of the same definition continues the earlier sweep once its study is there: the study's
        search.n_trials settings are the sweep's (a fresh study would draw search.n_trials more)."""
        from sweep.orchestrate.searches.study import study_written

        return study_written(path)

    def held(self, plan, device: str) -> list[dict]:
        """The rows of the settings the study already holds (a resumed or continued sweep's), in the study's order:
        each trial known by its trial id, or by its parameters where a stop ended it before its id was recorded."""
        from sweep.orchestrate.searches.study import open_study

        study = open_study(plan.cfg.search, plan.path)
        if study is None:
            return []
        identify = _identifier(plan, device)
        ids = [t.user_attrs.get("trial_id") or identify(t.params) for t in study.get_trials(deepcopy=False)]
        return [plan.done[tid] for tid in dict.fromkeys(ids) if tid in plan.done]

    def searcher(self, plan, device):
        """The study's spec: Ray Tune's searcher is OptunaSearch over its define-by-run space
        (``sweep.orchestrate.ray.searcher``), whose proposals already measured are told from their rows."""
        from sweep.orchestrate.searches.study import StudySpec

        return StudySpec(plan.cfg.search, plan.path, plan.base, device, root=plan.root, known=plan.done)

    def retime(self, plan, device: str) -> list[list[str]]:
        """The settings the study ends with (its Pareto set, or its best feasible trial), again with the timed
        rounds that bring each one's noise floor to ``analysis.floor_target`` (``sweep.bench.noise.rounds_for_floor``
        from its own rounds; at most ``MAX_ROUNDS``), so they rank on the wall clock with floors that can tell
        their speedups from 1x. One whose rounds already do is not timed again."""
        from sweep.bench.noise import rounds_for_floor
        from sweep.orchestrate.searches.study import DefineByRun, best_trials, fixed_setting, open_study

        cfg = plan.cfg
        study = open_study(cfg.search, plan.path)
        if study is None:
            return []
        rows = done_rows(plan.root)
        out = []
        for trial in best_trials(study):
            row = rows.get(trial.user_attrs.get("trial_id"))
            if row is None or row.get("status") != "ok" or not row.get("round_aa_ms"):
                continue
            need = rounds_for_floor(row["round_baseline_ms"], row["round_aa_ms"], cfg.analysis.floor_target)
            rounds = min(need if need is not None else MAX_ROUNDS, MAX_ROUNDS)
            if rounds <= row["repeats"]:
                continue
            setting = fixed_setting(DefineByRun(spaces(cfg.search)), trial.params)
            out.append([*setting, f"bench.repeats={rounds}"])
        return out

    def trials(self, plan, device: str) -> int:
        """``search.n_trials``, or on a resume those the study still lacks (a trial counts only with its row:
        ``sweep.orchestrate.searches.study.remaining_trials``)."""
        from sweep.orchestrate.searches.study import remaining_trials

        if not plan.cfg.resume:
            return plan.cfg.search.n_trials
        own = sweep_rows(plan.root, plan.name)
        identify = _identifier(plan, device)
        return remaining_trials(plan.cfg.search, plan.path, rows=row_ids(plan.root), own=own, identify=identify)


def _identifier(plan, device: str):
    """Study parameters -> the trial id of their setting (None where they compose to nothing: a planted study's)."""
    from sweep.orchestrate.searches.study import DefineByRun, fixed_setting
    from sweep.orchestrate.settings import setting_id

    space = DefineByRun(spaces(plan.cfg.search))

    def identify(params: dict) -> str | None:
        if not params:
            return None
        try:
            setting = fixed_setting(space, params)
        except Exception:  # noqa: BLE001 - whatever a planted study's parameters make Optuna's fixed trial raise
            return None
        return setting_id(plan.base, setting, device)

    return identify
