"""Each search kind's own settings, typed, over the shared base (``SearchConfig``: conf/config.yaml's ``search:``).

A kind (``search.kind``) is a class here holding only its own keys, their defaults in conf/search/kind/<kind>.yaml,
and the rules of its keys (``check``, run when the config is validated), registered once in ``SEARCH_KINDS``: every
list of kinds comes from it. What a kind does with its settings (what it plans, a pass in a worker, what it hands
Ray Tune) is its module in ``sweep.orchestrate.searches``. A shipped search (conf/search/<name>.yaml) names its kind
in its defaults list (``override kind@_here_: <kind>``; a grid by default) and holds only its own values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from sweep.config._fields import build, field, in_range
from sweep.config._schema import SearchConfig
from sweep.config.search import WITH_THE_SET, grid, spaces
from sweep.errors import ConfigError
from sweep.gates import GATES
from sweep.gates.registry import Registry

SEARCH_KINDS: Registry[type[SearchConfig]] = Registry("search kind", name_of=lambda cls: cls.KIND)
T = TypeVar("T", bound=type)


def search_kind(cls: T) -> T:
    """The one registration of a kind's settings (``@search_kind`` on its class)."""
    SEARCH_KINDS.register(cls)
    return cls


def build_search(data: Any) -> SearchConfig:
    """``data`` (the composed ``search`` mapping) as its kind's typed settings, the kind's rules checked; a key of
    another kind is refused naming the kinds that take it."""
    if not isinstance(data, dict):
        raise ConfigError(f"search: expected a mapping, got {data!r}")
    cls = SEARCH_KINDS.get(data.get("kind"), key="search.kind")
    own = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key in own:
            continue
        if key in WITH_THE_SET.values():
            raise ConfigError(
                f"search.{key}: searched jointly with a skip set by a skipset search only (search.kind is "
                f"{cls.KIND}); sweep {_with_the_set(key)} in search.spaces instead"
            )
        foreign = foreign_key(key, cls.KIND)
        if foreign:
            raise ConfigError(foreign)
    return build(cls, data, "search.").settled()


def foreign_key(key: str, kind: str | None) -> str | None:
    """The line for ``search.KEY`` given to a search of ``kind`` (None: not known) when KEY is a key of other kinds
    only, naming them; None when KEY is no kind's own key."""
    takers = [k.KIND for k in SEARCH_KINDS if key in {f.name for f in dataclasses.fields(k)} and k.KIND != kind]
    if not takers or key in {f.name for f in dataclasses.fields(SearchConfig)}:
        return None
    article = "an" if takers[0][0] in "aeiou" else "a"
    this = f"this {kind} search" if kind else "the chosen search's kind"
    return f"search.{key}: a key of {article} {' or '.join(takers)} search, not of {this} (search.kind)"


def own_keys(kind: str) -> list[str]:
    """The keys a search of ``kind`` takes: the shared base's and its own."""
    return [f.name for f in dataclasses.fields(SEARCH_KINDS.get(kind, key="search.kind"))]


def kind_keys(kind: str) -> list[str]:
    """The keys only a search of ``kind`` takes (its own, beyond the shared base's)."""
    shared = {f.name for f in dataclasses.fields(SearchConfig)}
    return [k for k in own_keys(kind) if k not in shared]


def kind_chosen(overrides) -> list[str]:
    """``search.kind=KIND`` as the choice of the kind's own settings (conf/search/kind/KIND.yaml, over the shared
    base and under the search's own values): a kind's keys and their defaults come with it. An unknown kind is one
    line naming the registered ones."""
    out = []
    for o in overrides:
        key, eq, value = str(o).partition("=")
        if eq and key.lstrip("+") == "search.kind":
            SEARCH_KINDS.get(value, key="search.kind")
            o = f"search/kind@search={value}"
        out.append(o)
    return out


def _with_the_set(listed: str) -> str:
    return next(key for key, name in WITH_THE_SET.items() if name == listed)


def no_intervals(search: SearchConfig) -> None:
    """A search that runs a grid: every value of its sub-spaces listed (no interval), and at most ``MAX_TRIALS``."""
    grid(search)


@dataclass(frozen=True, kw_only=True)
class Screening(SearchConfig):
    """What the kinds that screen on a profile trace share (screen, bracket): the simulated front and the knee's
    ``neighbours`` on each side of its threshold run closed-loop."""

    neighbours: int = field(check=in_range(0, 100), allowed="an integer in 0..100")

    def check(self) -> None:
        no_intervals(self)


@search_kind
@dataclass(frozen=True, kw_only=True)
class BracketSettings(Screening):
    """`kind: bracket`: a screen whose thresholds are bracketed from the model's own signal, ``n_trials`` kept per
    line (a gate with one combination of its other values)."""

    KIND: ClassVar[str] = "bracket"

    def check(self) -> None:
        super().check()  # the lines: every combination of the other values
        if self.n_trials is None or self.n_trials < 2:
            given = ": required" if self.n_trials is None else f"={self.n_trials}: at least 2"
            raise ConfigError(f"search.n_trials{given} for a bracket search (thresholds kept per line, >= 2)")
        for i, params in enumerate(spaces(self)):
            gate = next((p for p in params if p.key == "gate" and p.kind == "fixed"), None)
            if gate is None:
                raise ConfigError(f"search.spaces[{i}]: a bracket sub-space names its gate (gate: saturation, ...)")
            spec = GATES.get(gate.values[0], key=f"search.spaces[{i}].gate")
            if spec.threshold is None:
                raise ConfigError(f"search.spaces[{i}].gate={spec.name}: has no threshold to bracket")
            if any(p.key == f"gate.{spec.threshold}" for p in params):
                raise ConfigError(
                    f"search.spaces[{i}].gate.{spec.threshold}: a bracket search derives it from the model's "
                    f"signal; leave it out (search=screen sweeps given values)"
                )


@search_kind
@dataclass(frozen=True, kw_only=True)
class GridSettings(SearchConfig):
    """`kind: grid`: every point of the sub-spaces, each run closed-loop. No keys of its own."""

    KIND: ClassVar[str] = "grid"

    def check(self) -> None:
        no_intervals(self)
        _every_setting(self)


def _every_setting(search: SearchConfig) -> None:
    """A grid or a screen runs (or screens) every setting of its sub-spaces: ``n_trials`` would change nothing."""
    if search.n_trials is not None:
        raise ConfigError(
            f"search.n_trials={search.n_trials}: a {search.kind} search "
            f"{'replays' if search.kind == 'screen' else 'runs'} every setting of its sub-spaces; "
            "n_trials counts the settings of an optuna, bracket or skipset search (leave it null)"
        )


@search_kind
@dataclass(frozen=True, kw_only=True)
class OptunaSettings(SearchConfig):
    """`kind: optuna`: ``n_trials`` settings drawn by Optuna's ``sampler`` (seeded), towards the search's
    objectives under its constraints."""

    KIND: ClassVar[str] = "optuna"
    sampler: Literal["tpe", "random", "nsga2"]

    def check(self) -> None:
        if self.n_trials is None:
            raise ConfigError("search.n_trials: required for an optuna search")
        if self.objectives is None:
            raise ConfigError(
                "search.objectives: required for an optuna search (the metrics it optimises, e.g. "
                "{speedup_model: max, agreement: max})"
            )


@search_kind
@dataclass(frozen=True, kw_only=True)
class ScreenSettings(Screening):
    """`kind: screen`: a dense grid replayed on a profile trace; the simulated front and the knee's
    ``neighbours`` run closed-loop."""

    KIND: ClassVar[str] = "screen"

    def check(self) -> None:
        super().check()
        _every_setting(self)


def _distinct(each):
    """A check for a non-empty list of distinct values, ``each(x)`` true for every one (never a bool)."""
    return lambda v: len(v) > 0 and all(not isinstance(x, bool) and each(x) for x in v) and len(set(v)) == len(v)


_distinct_stops = _distinct(lambda x: x is None or (isinstance(x, (int, float)) and 0 <= x <= 1))
_distinct_lens = _distinct(lambda x: isinstance(x, int) and 1 <= x <= 64)


@search_kind
@dataclass(frozen=True, kw_only=True)
class SkipSetSettings(SearchConfig):
    """`kind: skipset`: skip sets screened by an Optuna study in a worker (``n_trials`` sets, by ``sampler``,
    their skip ratio in ``skip_ratio``); the best ``closed_loop`` run closed-loop, with the draft_stop and draft_len
    drawn with the set (``draft_stops``, ``draft_lens``) where those are listed."""

    KIND: ClassVar[str] = "skipset"
    sampler: Literal["tpe", "random"]
    # the skip ratio |S| / 2L range candidates must keep (null: any)
    skip_ratio: list | None = field(
        None,
        check=lambda v: len(v) == 2 and all(isinstance(x, (int, float)) for x in v) and 0 <= v[0] <= v[1] <= 1,
        allowed="[lo, hi] with 0 <= lo <= hi <= 1, or null",
    )
    closed_loop: int | None = field(None, check=in_range(1, 1000), allowed="an integer in 1..1000 or null")
    # bench.draft_stop values searched jointly with the set, e.g. [null, 0.3, 0.6, 0.9] (null: the set alone)
    draft_stops: list | None = field(
        None,
        check=_distinct_stops,
        allowed="a non-empty list of distinct draft_stop values (each null or a number in [0, 1]), or null",
    )
    # bench.draft_len values searched jointly with the set, e.g. [1, 2, 3, 4] (null: bench.draft_len alone)
    draft_lens: list | None = field(
        None,
        check=_distinct_lens,
        allowed="a non-empty list of distinct draft lengths (integers in 1..64), or null",
    )

    def settled(self) -> SkipSetSettings:
        """0 and 0.0 are one draft_stop, as bench.draft_stop reads them: one trial."""
        if self.draft_stops is None:
            return super().settled()
        stops = [None if x is None else float(x) for x in self.draft_stops]
        return dataclasses.replace(super().settled(), draft_stops=stops)

    def check(self) -> None:
        """One sub-space naming gate=skip and fixing the rest of the setting (the skip set itself is what the
        screen searches), and how many of the best sets run closed-loop."""
        if self.n_trials is None:
            raise ConfigError("search.n_trials: required for a skipset search")
        if self.closed_loop is None:
            raise ConfigError(
                "search.closed_loop: required for a skipset search (how many of the best sets run closed-loop)"
            )
        if len(self.spaces) != 1:
            raise ConfigError(f"search.spaces: a skipset search has one sub-space (it has {len(self.spaces)})")
        params = spaces(self)[0]
        gate = next((p for p in params if p.key == "gate"), None)
        if gate is None or gate.kind != "fixed" or gate.values[0] != "skip":
            raise ConfigError("search.spaces[0].gate: a skipset search's sub-space is gate: skip")
        for p in params:
            if p.kind != "fixed":
                raise ConfigError(f"{p.where}: a skipset search fixes every key but the skip set (found a sweep)")
            if p.key == "gate.skip":
                raise ConfigError(f"{p.where}: the skip set is what a skipset search searches; leave gate.skip out")
            if p.key in WITH_THE_SET and getattr(self, WITH_THE_SET[p.key]) is not None:
                raise ConfigError(
                    f"{p.where}: search.{WITH_THE_SET[p.key]} searches {p.key} with the set; leave one of them out"
                )
