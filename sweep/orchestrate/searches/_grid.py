"""`kind: grid`: every point of the sub-spaces, each run closed-loop (bundled against shared baselines)."""

from __future__ import annotations

from sweep.config import compose
from sweep.config.search import grid
from sweep.config.search_kinds import GridSettings
from sweep.orchestrate.settings import merge
from sweep.orchestrate.searches.base import Search, register


@register
class Grid(Search):
    settings = GridSettings
    summary = "every point of search.spaces (choice, range), each run closed-loop"

    def foresee(self, cfg, base):
        return [(trial, compose(merge(base, trial))) for trial in grid(cfg.search)]
