"""A typed registry: named items of one kind, duplicates rejected, unknown names answered
with "did you mean" and the allowed list (one ``ConfigError`` line naming the key)."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from sweep.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Items of one kind (``kind`` names it in errors), keyed by ``name_of(item)``."""

    def __init__(self, kind: str, name_of: Callable[[T], str] = lambda item: getattr(item, "name")) -> None:
        self.kind = kind
        self._name_of = name_of
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        name = self._name_of(item)
        if name in self._items:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._items[name] = item
        return item

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def get(self, name: str, *, key: str) -> T:
        """The item called ``name``; ``key`` is the config key the name came from."""
        if name not in self._items:
            close = difflib.get_close_matches(str(name), self._items, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}={name}: unknown {self.kind}{hint}; allowed: {', '.join(self._items)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
