"""Search spaces: sub-spaces of config paths written in Hydra's sweep grammar.

A sweep is a list of sub-spaces (so one sweep can cover several gates or models); each
maps a config path, or a group (``model``, ``gate``, ``prompts``), to a fixed value or a
sweep expression: ``choice(...)``, ``range(a,b,step=s)``, ``interval(a,b)``,
``int(interval(a,b))``, ``tag(log, interval(a,b))``. This module parses them into typed
parameters and expands grids; mapping them to Ray Tune and Optuna lives in ``sweep.orchestrate.ray.searcher``.
A trial is a list of Hydra overrides on top of the sweep's own.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweep.errors import ConfigError
from sweep.gates import GATES, PARAMS, check_value
from sweep.config.identity import TRIAL_SECTIONS
from sweep.config.paths import check_name, override_key, quoted

if TYPE_CHECKING:
    from sweep.config import SearchConfig

METRICS = (
    "speedup_wall",
    "agreement",
    "prefix_agreement",
    "exact_match",
    "speedup_model",
    "exit_rate",
    "layers_saved",
    "ms_per_token",
    "accuracy",  # a task's, with eval.task set (sweep.tasks.evaluate)
    "accuracy_loss",
)
TASK_METRICS = ("accuracy", "accuracy_loss")
# metrics that are fractions (docs/schema.md): a constraint's minimum outside [0, 1] is never met, or always
FRACTIONS = ("agreement", "prefix_agreement", "exact_match", "exit_rate", "layers_saved", "accuracy")


MAX_VALUES = 10_000  # values one range(...) may expand to
MAX_TRIALS = 100_000  # trials one grid may expand to


@dataclass(frozen=True)
class Param:
    """One swept config path: ``fixed`` (one value), ``choice`` (values) or ``interval`` (low..high).

    ``where`` names it in errors (``search.spaces[0].gate.eps``, ``calibrate.grid``)."""

    key: str
    kind: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    where: str = field(default="", compare=False)

    def grid_values(self) -> tuple:
        if self.kind == "interval":
            raise ConfigError(
                f"{self.where or self.key}: interval(...) is continuous; a grid needs choice(...) or range(...)"
            )
        return self.values


def parse_space(space: dict[str, Any], where: str) -> list[Param]:
    """Typed parameters of one sub-space, groups first (as Hydra applies them)."""
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{where}: must be a non-empty mapping of config path: value or sweep expression")
    for key in space:
        if override_key(str(key)).split(".")[0] not in TRIAL_SECTIONS:
            raise ConfigError(
                f"{where}.{key}: not a key a setting can vary (the sweep's own: set it on the command line); a "
                f"sub-space varies {', '.join(TRIAL_SECTIONS)}"
            )
    params = [parse_value(key, raw, f"{where}.{key}") for key, raw in space.items()]
    return sorted(params, key=lambda p: "." in p.key)


def parse_value(key: str, raw: Any, where: str) -> Param:
    """One config path's value or sweep expression, parsed by Hydra's grammar; ``where``
    names it in errors."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    text = "null" if raw is None else str(raw).lower() if isinstance(raw, bool) else str(raw)
    try:
        value = OverridesParser.create().parse_overrides([f"{key}={text}"])[0].value()
    except HydraException as exc:
        raise ConfigError(f"{where}={raw}: cannot parse ({_parse_reason(exc)})") from None
    if isinstance(value, ChoiceSweep):
        return Param(key, "choice", tuple(value.list), where=where)
    if isinstance(value, RangeSweep):
        return Param(key, "choice", tuple(_frange(value.start, value.stop, value.step, f"{where}={raw}")), where=where)
    if isinstance(value, IntervalSweep):
        _check_finite((value.start, value.end), f"{where}={raw}: interval")
        if not value.start < value.end:
            raise ConfigError(f"{where}={raw}: interval needs low < high")
        if "log" in value.tags and value.start <= 0:
            raise ConfigError(f"{where}={raw}: a log interval needs low > 0")
        integer = isinstance(value.start, int) and isinstance(value.end, int)
        return Param(
            key, "interval", low=value.start, high=value.end, log="log" in value.tags, integer=integer, where=where
        )
    return Param(key, "fixed", (value,), where=where)


def _check_finite(values: tuple, what: str) -> None:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{what} bounds must be finite numbers (got {v})")


def _frange(start, stop, step, what: str = "range(...)"):
    """Hydra's range(start, stop, step), without float drift (0.1 + 0.2 stays 0.3); finite
    bounds, a step that is not 0, and at most ``MAX_VALUES`` values."""
    _check_finite((start, stop, step), f"{what}: range")
    if step == 0:
        raise ConfigError(f"{what}: range(...) step must not be 0")
    count = math.ceil((stop - start) / step)
    if count <= 0:  # an empty space would run nothing and say only that
        raise ConfigError(
            f"{what}: range(...) has no values (it runs from {start} towards {stop}, stop excluded, by {step})"
        )
    if count > MAX_VALUES:
        raise ConfigError(f"{what}: range(...) has {count} values; at most {MAX_VALUES} (use a larger step)")
    integer = all(isinstance(v, int) for v in (start, stop, step))
    out, i = [], 0
    while True:
        value = start + i * step if integer else round(start + i * step, 12)
        if (step > 0 and value >= stop) or (step < 0 and value <= stop):
            return out
        out.append(value)
        i += 1


def spaces(search: SearchConfig) -> list[list[Param]]:
    """The sweep's sub-spaces, parsed (once per distinct list: every trial's config carries it)."""
    return [list(params) for params in _parsed(json.dumps(search.spaces, sort_keys=True))]


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> tuple[tuple[Param, ...], ...]:
    return tuple(tuple(parse_space(space, f"search.spaces[{i}]")) for i, space in enumerate(json.loads(text)))


def as_override(key: str, value: Any) -> str:
    """A Hydra override string for one parameter value (strings quoted when Hydra needs it)."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_./-]+", value):
        return f"{key}={quoted(value)}"
    return f"{key}={value}"


def setting_override(key: str, value: Any) -> str:
    """``as_override`` of a sub-space's value as this process reads it (``paths.read_value``: a path, a published
    skip set's file, made absolute here), for a worker that composes it in a directory of its own."""
    from sweep.config.paths import read_value

    return as_override(key, read_value(key, value))


def grid(search: SearchConfig) -> list[list[str]]:
    """Every trial of a grid sweep: the union over sub-spaces of each one's cross product
    (at most ``MAX_TRIALS``)."""
    parsed = spaces(search)
    total = sum(math.prod(len(p.grid_values()) for p in params) for params in parsed)
    if total > MAX_TRIALS:
        raise ConfigError(f"search.spaces: the grid has {total} trials; at most {MAX_TRIALS} (use fewer values)")
    trials = []
    for params in parsed:
        for combo in itertools.product(*(p.grid_values() for p in params)):
            trials.append([as_override(p.key, v) for p, v in zip(params, combo)])
    return trials


# bench keys a skipset search can draw with the set, each from the search key listing its values
WITH_THE_SET = {"bench.draft_stop": "draft_stops", "bench.draft_len": "draft_lens"}


def check_search(search: SearchConfig, gate: str | None = None) -> None:
    """Objectives and constraints name metrics; every gate parameter value a sub-space can produce is in its
    gate's domain (``gate``: the sweep's own gate, for sub-spaces that do not name one). Needs no model and no
    Ray. What a search kind needs of its own keys is the kind's to check (``sweep.orchestrate.searches``), when
    `sweep run` plans."""
    for metric, mode in (search.objectives or {}).items():
        if metric not in METRICS:
            raise ConfigError(f"search.objectives.{metric}: not a metric; allowed: {', '.join(METRICS)}")
        if mode not in ("max", "min"):
            raise ConfigError(f"search.objectives.{metric}={mode}: must be max or min")
    for metric, bound in search.constraints.items():
        if metric not in METRICS:
            raise ConfigError(f"search.constraints.{metric}: not a metric; allowed: {', '.join(METRICS)}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise ConfigError(f"search.constraints.{metric}={bound}: must be a number (finite: the metric's minimum)")
        if metric in FRACTIONS and not 0 <= bound <= 1:
            raise ConfigError(
                f"search.constraints.{metric}={bound}: must be a number in [0, 1] ({metric} is a fraction: a minimum "
                "above 1 is never met, one below 0 always)"
            )
    if search.constraints and len(search.objectives or {}) != 1:
        raise ConfigError("search.constraints: supported with a single objective (e.g. speedup_wall: max)")
    for i, params in enumerate(spaces(search)):  # parse errors surface here, before Ray starts
        _check_gate_values(params, gate, f"search.spaces[{i}]")
        _check_names(params)


def check_given(search: SearchConfig, given: set[str]) -> None:
    """A key of the command line (``given``, as ``override_key`` spells it) that a skipset search draws with each set
    (``WITH_THE_SET``): the drawn value replaces it, so it would change nothing. One line naming it. (A key that
    every sub-space sets is not refused: the sweep's own config must compose, and may need it, as a classifier's
    gate.theta.)"""
    for key in sorted(given):
        listed = WITH_THE_SET.get(key)
        if listed is not None and getattr(search, listed, None) is not None:
            raise ConfigError(
                f"{key}: search.{listed} draws it with each set; it would change nothing (leave one of them out)"
            )


def _check_gate_values(params: list[Param], gate: str | None, where: str) -> None:
    """Each gate parameter of a sub-space, at every value a grid takes and both ends of an
    interval, against each gate the sub-space can select."""
    named = next((p for p in params if p.key == "gate"), None)
    if named is not None and named.kind == "interval":
        raise ConfigError(f"{where}.gate: must be a gate name or choice(...) of gate names")
    names = named.values if named is not None else (() if gate is None else (gate,))
    for name in names:
        spec = GATES.get(name, key=f"{where}.gate")
        for p in params:
            param = p.key.removeprefix("gate.")
            if not p.key.startswith("gate.") or param not in PARAMS:
                continue
            for value in p.values if p.kind != "interval" else (p.low, p.high):
                if param == "skip" and isinstance(value, str) and value.strip().startswith("file:"):
                    # a published set's file is read where each setting composes (relative to that process's
                    # directory): by the driver for every foreseeable setting, and it hands its workers the set's
                    # layers (``sweep.orchestrate.plan.as_read``); never here, where a worker composes its base
                    continue
                check_value(spec, param, value, f"{where}.{p.key}")


NAME_KEYS = ("model.name",)  # config paths a sub-space may set whose value becomes a directory name


def _check_names(params: list[Param]) -> None:
    for p in params:
        if p.key in NAME_KEYS:
            if p.kind == "interval":
                raise ConfigError(f"{p.where}: must be a name or choice(...) of names")
            for value in p.values:
                if value is not None:
                    check_name(p.where, str(value))


def check_ladder(ladder: str, gate: str) -> list:
    """A calibration ladder (``calibrate.grid``) for ``gate``'s threshold: parsed, a grid, and
    every value in the gate's domain; returns its values."""
    spec = GATES.get(gate, key="gate")
    if spec.threshold is None:
        raise ConfigError(f"gate={gate}: has no threshold to calibrate; use a gate with one (saturation, margin, ...)")
    param = parse_value(f"gate.{spec.threshold}", ladder, "calibrate.grid")
    values = list(param.grid_values())
    domain = spec.domain(spec.threshold)  # its check refuses strings, booleans and null as well
    for value in values:
        if not domain.check(value):
            raise ConfigError(
                f"calibrate.grid={ladder}: {value!r} is not a value of gate.{spec.threshold}; "
                f"gate={gate} needs each to be {domain.allowed}"
            )
    return values


def _parse_reason(exc: Exception) -> str:
    """Hydra's reason in one line: the line after its "Error parsing override" heading, and for a null in
    choice(...), which its grammar refuses, what to write instead."""
    if "NoneType is incompatible" in str(exc):
        return "choice(...) cannot hold null in Hydra's grammar; give the null value a space of its own"
    lines = [line for line in str(exc).splitlines() if line and not line.startswith("See https://")]
    if len(lines) > 1 and lines[0].startswith("Error parsing override"):
        return lines[1]
    return lines[0] if lines else type(exc).__name__
