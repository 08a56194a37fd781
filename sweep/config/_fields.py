"""Typed config fields with a range check and a sentence saying what is allowed.

``build(cls, data, prefix)`` turns a plain dict (from Hydra) into the frozen dataclass
``cls`` and raises ``ConfigError`` naming the first bad key and what it may be.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Literal, Union

from sweep.errors import ConfigError

Check = Callable[[Any], bool]


def field(default: Any = dataclasses.MISSING, *, check: Check | None = None, allowed: str = "") -> Any:
    """A dataclass field whose value must satisfy ``check``; ``allowed`` says what passes."""
    meta = {"check": check, "allowed": allowed}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def at_least(lo: float) -> Check:
    return lambda v: v >= lo


def in_range(lo: float, hi: float, *, lo_open: bool = False) -> Check:
    return lambda v: (v > lo if lo_open else v >= lo) and v <= hi


def _describe(tp: Any) -> str:
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if typing.get_origin(tp) is tuple:
        return "a list"
    return str(tp)


def _split_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` or raise ConfigError naming ``key``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = typing.get_args(tp)
        for option in options:
            try:
                return _coerce(option, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={value!r}: must be " + " or ".join(_describe(o) for o in options))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return build(tp, value, key + ".")
    if typing.get_origin(tp) is tuple:  # tuple[X, ...]: a YAML list, each item an X
        (item, *_rest) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if typing.get_origin(tp) is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}={value}: must be {_describe(tp)}")
        return value
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
        or (tp is dict and isinstance(value, dict))
        or (tp is list and isinstance(value, list))
    )
    if not ok:
        raise ConfigError(f"{key}={value!r}: must be {_describe(tp)}")
    return float(value) if tp is float else value


def _finite(value: Any) -> bool:
    """inf and nan are never a setting: every float field must be a finite number."""
    return not isinstance(value, float) or math.isfinite(value)


def build(cls: type, data: dict, prefix: str = "") -> Any:
    """Validate ``data`` against dataclass ``cls``; unknown keys and bad values are errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(f"{prefix}{key}: unknown key; allowed: {', '.join(names)}")
    values = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.name in data:
            value = data[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"{key}: missing; it is required")
        tp, optional = _split_optional(hints[f.name])
        if value is None:
            if not optional:
                raise ConfigError(f"{key}: must not be null; must be {_describe(tp)}")
        else:
            try:
                value = _coerce(tp, value, key)
            except ConfigError:  # a field that says what it allows says it whole, not just its type
                if dataclasses.is_dataclass(tp) or not f.metadata.get("allowed"):
                    raise
                raise ConfigError(f"{key}={value!r}: must be {f.metadata['allowed']}") from None
            check = f.metadata.get("check")
            if not _finite(value) or (check is not None and not check(value)):
                why = getattr(check, "why", None)  # a check that can say what is wrong with the value
                reason = why(value) if why is not None and _finite(value) else None
                said = f" ({reason})" if reason else ""
                raise ConfigError(f"{key}={value}: must be {f.metadata.get('allowed') or 'valid'}{said}")
        values[f.name] = value
    return cls(**values)
