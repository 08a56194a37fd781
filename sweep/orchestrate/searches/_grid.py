"""`kind: grid`: every point of the sub-spaces, each run closed-loop (bundled against shared baselines)."""

from __future__ import annotations

from sweep.config import compose
from sweep.config.search import grid
from sweep.orchestrate.settings import merge
from sweep.orchestrate.searches.base import Search, register


@register
class Grid(Search):
    kind = "grid"
    summary = "every point of search.spaces (choice, range), each run closed-loop"

    def check(self, search) -> None:
        super().check(search)
        grid(search)  # an interval is not a grid; the grid's size is bounded

    def foresee(self, cfg, base):
        return [(trial, compose(merge(base, trial))) for trial in grid(cfg.search)]
