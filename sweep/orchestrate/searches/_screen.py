"""`kind: screen`: profile once, replay a dense grid of the search's sub-spaces on the trace, run closed-loop
trials only for the simulated front and the knee's neighbours (``sweep.orchestrate.searches.screening``)."""

from __future__ import annotations

from sweep.config.search_kinds import ScreenSettings
from sweep.orchestrate.searches.base import InWorker, Search, Selection, register
from sweep.orchestrate.searches.screening import dense_settings, screen, screened_before, selection_written
from sweep.orchestrate.settings import Plan


@register
class Screen(Search):
    settings = ScreenSettings
    summary = "a profile trace replays a dense grid of search.spaces; the simulated front runs closed-loop"

    def foresee(self, cfg, base):
        return dense_settings(cfg, base)

    def continues(self, root, path) -> bool:
        return selection_written(root, path.name)

    def select(self, plan: Plan, worker: InWorker) -> Selection:
        if plan.cfg.resume:
            earlier = screened_before(plan, plan.grid_trials, worker.device)
            if earlier is not None:
                return earlier
        return screen(plan, plan.grid_trials, worker)
