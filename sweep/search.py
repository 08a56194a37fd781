"""Search spaces: sub-spaces of config paths written in Hydra's sweep grammar.

A sweep is a list of sub-spaces (so one sweep can cover several gates or models); each
maps a config path, or a group (``model``, ``gate``, ``prompts``), to a fixed value or a
sweep expression: ``choice(...)``, ``range(a,b,step=s)``, ``interval(a,b)``,
``int(interval(a,b))``, ``tag(log, interval(a,b))``. This module parses them into typed
parameters and expands grids; mapping them to Ray Tune and Optuna lives in ``sweep.tune``.
A trial is a list of Hydra overrides on top of the sweep's own.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from sweep.config import SearchConfig
from sweep.errors import ConfigError

METRICS = ("speedup_wall", "agreement", "prefix_agreement", "exact_match", "speedup_model", "exit_rate", "layers_saved", "ms_per_token")


@dataclass(frozen=True)
class Param:
    """One swept config path: ``fixed`` (one value), ``choice`` (values) or ``interval`` (low..high)."""

    key: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    def grid_values(self) -> tuple:
        if self.kind == "interval":
            raise ConfigError(f"search.spaces: {self.key}: interval(...) is continuous; a grid needs choice(...) or range(...)")
        return self.values


def parse_space(space: dict[str, Any], where: str) -> list[Param]:
    """Typed parameters of one sub-space, groups first (as Hydra applies them)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{where}: must be a non-empty mapping of config path: value or sweep expression")
    parser = OverridesParser.create()
    params = []
    for key, raw in space.items():
        text = "null" if raw is None else str(raw).lower() if isinstance(raw, bool) else str(raw)
        try:
            value = parser.parse_overrides([f"{key}={text}"])[0].value()
        except HydraException as exc:
            raise ConfigError(f"{where}.{key}={raw}: cannot parse ({str(exc).splitlines()[0]})") from None
        if isinstance(value, ChoiceSweep):
            params.append(Param(key, "choice", tuple(value.list)))
        elif isinstance(value, RangeSweep):
            params.append(Param(key, "choice", tuple(_frange(value.start, value.stop, value.step))))
        elif isinstance(value, IntervalSweep):
            integer = isinstance(value.start, int) and isinstance(value.end, int)
            if not value.start < value.end:
                raise ConfigError(f"{where}.{key}={raw}: interval needs low < high")
            if "log" in value.tags and value.start <= 0:
                raise ConfigError(f"{where}.{key}={raw}: a log interval needs low > 0")
            params.append(Param(key, "interval", low=value.start, high=value.end, log="log" in value.tags, integer=integer))
        else:
            params.append(Param(key, "fixed", (value,)))
    return sorted(params, key=lambda p: "." in p.key)


def _frange(start, stop, step):
    """Hydra's range(start, stop, step), without float drift (0.1 + 0.2 stays 0.3)."""
    if step == 0:
        raise ConfigError("search.spaces: range(...) step must not be 0")
    integer = all(isinstance(v, int) for v in (start, stop, step))
    out, i = [], 0
    while True:
        value = start + i * step if integer else round(start + i * step, 12)
        if (step > 0 and value >= stop) or (step < 0 and value <= stop):
            return out
        out.append(value)
        i += 1


def spaces(search: SearchConfig) -> list[list[Param]]:
    return [parse_space(space, f"search.spaces[{i}]") for i, space in enumerate(search.spaces)]


def as_override(key: str, value: Any) -> str:
    """A Hydra override string for one parameter value (strings quoted when Hydra needs it)."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_./-]+", value):
        return f"{key}='{value}'"
    return f"{key}={value}"


def grid(search: SearchConfig) -> list[list[str]]:
    """Every trial of a grid sweep: the union over sub-spaces of each one's cross product."""
    trials = []
    for params in spaces(search):
        for combo in itertools.product(*(p.grid_values() for p in params)):
            trials.append([as_override(p.key, v) for p, v in zip(params, combo)])
    return trials


def check_search(search: SearchConfig) -> None:
    """Objectives and constraints name metrics; kinds have what they need."""
    for metric, mode in search.objectives.items():
        if metric not in METRICS:
            raise ConfigError(f"search.objectives.{metric}: not a metric; allowed: {', '.join(METRICS)}")
        if mode not in ("max", "min"):
            raise ConfigError(f"search.objectives.{metric}={mode}: must be max or min")
    for metric, bound in search.constraints.items():
        if metric not in METRICS:
            raise ConfigError(f"search.constraints.{metric}: not a metric; allowed: {', '.join(METRICS)}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise ConfigError(f"search.constraints.{metric}={bound}: must be a number (the metric's minimum)")
    if search.kind == "optuna" and search.n_trials is None:
        raise ConfigError("search.n_trials: required for an optuna search")
    if search.constraints and len(search.objectives) != 1:
        raise ConfigError("search.constraints: supported with a single objective (e.g. speedup_wall: max)")
    spaces(search)  # parse errors surface here, before Ray starts
    if search.kind in ("grid", "screen"):
        grid(search)
