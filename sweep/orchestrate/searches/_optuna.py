"""`kind: optuna`: Optuna, seeded, as Ray Tune's searcher over the sub-spaces (its study in SQLite beside the
sweep: ``sweep.orchestrate.study``)."""

from __future__ import annotations

from sweep.config import compose
from sweep.config.search import as_override, spaces
from sweep.errors import ConfigError
from sweep.orchestrate.settings import merge, row_ids
from sweep.orchestrate.searches.base import Search, register


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

        from sweep.orchestrate.searcher import optuna_search

        cfg = plan.cfg
        found = optuna_search(cfg.search, plan.path, base=plan.base, device=device, root=plan.root, known=plan.done)
        if cfg.sweep.max_concurrent is not None:
            found = ConcurrencyLimiter(found, max_concurrent=cfg.sweep.max_concurrent)
        return found

    def trials(self, plan) -> int:
        """``search.n_trials``, or on a resume those the study still lacks (a trial counts only with its row:
        ``sweep.orchestrate.study.remaining_trials``)."""
        from sweep.orchestrate.study import remaining_trials

        if not plan.cfg.resume:
            return plan.cfg.search.n_trials
        return remaining_trials(plan.cfg.search, plan.path, rows=row_ids(plan.root))
