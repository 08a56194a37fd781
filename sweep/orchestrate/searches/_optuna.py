"""`kind: optuna`: Optuna, seeded, as Ray Tune's searcher over the sub-spaces (its study in SQLite beside the
sweep: ``sweep.orchestrate.searches.study``)."""

from __future__ import annotations

from sweep.config import compose
from sweep.config.search import as_override, spaces
from sweep.errors import ConfigError
from sweep.orchestrate.settings import merge, row_ids, sweep_rows
from sweep.orchestrate.searches.base import Search, register

MAX_ROUNDS = 64  # timed rounds a re-timed setting gets at most (a floor the offset alone keeps above the target)


def best_trials(study) -> list:
    """The trials a study ends with: its Pareto set (or best) among the complete trials whose constraints are all
    met (``constraints`` <= 0, as the study records them), each setting once."""
    import optuna

    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if all(c <= 0 for c in t.system_attrs.get("constraints", []))
    ]
    best, seen = [], set()
    for t in feasible:
        dominated = any(_dominates(o.values, t.values, study.directions) for o in feasible if o is not t)
        if not dominated and t.user_attrs.get("trial_id") not in seen:
            seen.add(t.user_attrs.get("trial_id"))
            best.append(t)
    return best


def _dominates(a: list[float], b: list[float], directions) -> bool:
    import optuna

    sign = [1.0 if d == optuna.study.StudyDirection.MAXIMIZE else -1.0 for d in directions]
    better = [s * x >= s * y for s, x, y in zip(sign, a, b)]
    return all(better) and any(s * x > s * y for s, x, y in zip(sign, a, b))


def done_rows(root) -> dict[str, dict]:
    """Every row under ``root`` by trial id (its round timings included)."""
    from sweep.store import scan

    return {r["trial_id"]: r for r in scan("trials", root).collect().iter_rows(named=True)}


@register
class Optuna(Search):
    kind = "optuna"
    summary = "search.n_trials settings drawn by Optuna (seeded) from search.spaces, intervals included"
    samples = True

    def check(self, search) -> None:
        super().check(search)
        if search.n_trials is None:
            raise ConfigError("search.n_trials: required for an optuna search")

    def foresee(self, cfg, base):
        """Both ends of every interval and every choice composed: a bad value fails before Ray starts."""
        for params in spaces(cfg.search):
            fixed = [as_override(p.key, p.values[0]) for p in params if p.kind == "fixed"]
            for p in params:
                values = p.values if p.kind == "choice" else (p.low, p.high) if p.kind == "interval" else ()
                for value in values:
                    compose(merge(base, [*fixed, as_override(p.key, value)]))
        return None

    def searcher(self, plan, device):
        from ray.tune.search import ConcurrencyLimiter

        from sweep.orchestrate.ray.searcher import optuna_search

        cfg = plan.cfg
        found = optuna_search(cfg.search, plan.path, base=plan.base, device=device, root=plan.root, known=plan.done)
        if cfg.sweep.max_concurrent is not None:
            found = ConcurrencyLimiter(found, max_concurrent=cfg.sweep.max_concurrent)
        return found

    def retime(self, plan, device: str) -> list[list[str]]:
        """The settings the study ends with (its Pareto set, or its best feasible trial), again with the timed
        rounds that bring each one's noise floor to ``analysis.floor_target`` (``sweep.bench.noise.rounds_for_floor``
        from its own rounds; at most ``MAX_ROUNDS``), so they rank on the wall clock with floors that can tell
        their speedups from 1x. One whose rounds already do is not timed again."""
        import optuna

        from sweep.bench.noise import rounds_for_floor
        from sweep.orchestrate.searches.study import DefineByRun, open_study

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
            setting = DefineByRun(spaces(cfg.search))(optuna.trial.FixedTrial(trial.params))["trial"]
            out.append([*setting, f"bench.repeats={rounds}"])
        return out

    def trials(self, plan) -> int:
        """``search.n_trials``, or on a resume those the study still lacks (a trial counts only with its row:
        ``sweep.orchestrate.searches.study.remaining_trials``)."""
        from sweep.orchestrate.searches.study import remaining_trials

        if not plan.cfg.resume:
            return plan.cfg.search.n_trials
        own = sweep_rows(plan.root, plan.name)
        return remaining_trials(plan.cfg.search, plan.path, rows=row_ids(plan.root), own=own)
