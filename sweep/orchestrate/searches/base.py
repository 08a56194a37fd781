"""What a search kind does: one small interface, one registration per kind.

A search (``search.kind``) says what it plans (``foresee``: every setting it can compose before Ray starts, so a
bad value fails there), what it runs before the trials (``select``: an optional pass in a worker, a profile or a
screen, and on a resume what its earlier run chose) and what it hands the driver for Ray Tune (the settings of
``select``, run as a grid, or for a search that samples while Tune runs its ``searcher`` spec and how many trials
it draws). Its settings, their types and rules, are its class in ``sweep.config.search_kinds`` (``settings``), whose
registry names every kind: a behaviour registers for one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeVar

from sweep.config import Config, SearchConfig
from sweep.config.search_kinds import SEARCH_KINDS
from sweep.gates.registry import Registry

if TYPE_CHECKING:
    import polars as pl

    from sweep.orchestrate.settings import GridTrials, Plan

SEARCHES: Registry[Search] = Registry("search kind", name_of=lambda search: search.kind)
T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class Selection:
    """What a search hands Ray Tune: the settings to run (a grid; None: the search samples them while Tune runs,
    ``Search.searcher``) and, for a screen, the simulated table its settings were chosen from."""

    settings: GridTrials | None
    simulated: pl.DataFrame | None = None


class InWorker:
    """How a search runs a pass in a worker (a profile, a screen): ``run(fn, label, *args)`` calls ``fn(*args)``
    in a Ray task with the trials' resources, its progress shown on the driver under ``label``; a sweep error
    raised there is raised here. ``device``: the device the trials run on."""

    def __init__(self, run: Callable[..., Any], device: str) -> None:
        self.run, self.device = run, device


class Search:
    """One search kind's behaviour. Subclasses set ``settings`` (the kind's settings class, whose ``KIND`` is the
    ``search.kind`` value), ``summary``, and override what they do differently."""

    settings: ClassVar[type[SearchConfig]]
    summary: ClassVar[str] = ""
    samples: ClassVar[bool] = False  # True: its trials are drawn while Tune runs (``searcher``)

    @property
    def kind(self) -> str:
        return self.settings.KIND

    def foresee(self, cfg: Config, base: list[str]) -> GridTrials | None:
        """Every setting this search can foresee, composed (a bad value fails here, before Ray starts); None when
        its settings come later (sampled while Tune runs, or chosen by a pass in a worker)."""
        raise NotImplementedError

    def select(self, plan: Plan, worker: InWorker) -> Selection:
        """The settings to run closed-loop: by default those ``foresee`` planned."""
        return Selection(plan.grid_trials)

    def continues(self, root: Path, path: Path) -> bool:
        """Whether a plain re-run of the same definition continues the earlier sweep in ``path`` (its directory; as
        ``resume=true`` would) rather than starting a sweep of its own: for a kind whose selection is work of its own
        (a screen's trace, a skip-set study), once that sweep's selection is written (under ``root``). False by
        default: settings whose rows exist are skipped by any run."""
        return False

    def held(self, plan: Plan, device: str) -> list[dict]:
        """For a search that samples: the rows, already done, of the settings it held before this run (shown with this
        run's rows at the end); none by default."""
        return []

    def searcher(self, plan: Plan, device: str):
        """For a search that samples: what Ray Tune's searcher needs (its state persisted beside the sweep)."""
        raise NotImplementedError(f"search.kind={self.kind} hands Ray Tune a grid")

    def trials(self, plan: Plan, device: str) -> int:
        """For a search that samples: how many trials this run draws (on a resume, what the search still lacks)."""
        raise NotImplementedError(f"search.kind={self.kind} hands Ray Tune a grid")

    def retime(self, plan: Plan, device: str) -> list[list[str]]:
        """Settings to time again once the search has run (each one Tune trial, as a grid): none by default."""
        return []


def register(cls: T) -> T:
    """The one registration of a search kind's behaviour (``@register`` on its class), for a registered kind."""
    SEARCH_KINDS.get(cls.settings.KIND, key="search.kind")
    SEARCHES.register(cls())
    return cls


def search_for(search: SearchConfig) -> Search:
    """The search ``search.kind`` names, its own rules checked (one ConfigError line naming the key)."""
    found = SEARCHES.get(search.kind, key="search.kind")
    search.check()
    return found
