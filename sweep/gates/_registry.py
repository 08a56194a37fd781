"""One registry of gates: duplicate names are rejected, unknown ones get 'did you mean'."""

from __future__ import annotations

import difflib
from typing import Callable, TypeVar

from sweep.errors import ConfigError

T = TypeVar("T")


class Registry:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, type] = {}

    def register(self, cls: type[T]) -> type[T]:
        name = getattr(cls, "name")
        if name in self._items:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._items[name] = cls
        return cls

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def get(self, name: str, *, key: str) -> type:
        if name not in self._items:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}={name}: unknown {self.kind}{hint}; allowed: {', '.join(self._items)}")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items


GATES = Registry("gate")
register: Callable[[type[T]], type[T]] = GATES.register
