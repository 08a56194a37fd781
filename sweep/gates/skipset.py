"""Skip sets: which sublayers a skip-set draft bypasses, and their one canonical text form.

A skip set S is a set of (layer, sublayer) with layers 1-indexed and sublayer attention (``a``) or
MLP (``m``). Its text is ``+``-separated items ``a<layers>`` / ``m<layers>``, where ``<layers>`` is
one layer or a range ``i-j``: ``a3+m3+a5-9`` bypasses the attention of layers 3 and 5 to 9 and the
MLP of layer 3 (``+``, not a comma, so that a Hydra override takes it unquoted; commas parse too).
``none`` (or an empty text) is the empty set. The canonical form merges
consecutive layers into ranges and orders items by their first layer, attention before MLP, so one
set has one text (the ``skip`` column, the trial id's input). Its skip ratio is |S| / 2L.

Torch-free: the config is validated with it before any model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

KINDS = ("a", "m")  # attention, MLP
GRAMMAR = "'+'-separated a<layers>/m<layers> items (attention/MLP of layers 'i' or 'i-j', 1-indexed), or 'none'"
_ITEM = re.compile(r"^([am])(\d+)(?:-(\d+))?$")


class Candidate(NamedTuple):
    """A skip-set draft's setting as a skipset search screens it and runs it closed-loop: the skip set's
    canonical text, and its bench.draft_stop and bench.draft_len."""

    skip: str
    draft_stop: float | None
    draft_len: int | None


@dataclass(frozen=True)
class SkipSet:
    """The bypassed sublayers: 1-indexed layers whose attention (``attention``) or MLP (``mlp``) is skipped."""

    attention: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> SkipSet:
        """The set a text names; ValueError (saying what is allowed) when it does not parse."""
        if not isinstance(text, str):
            raise ValueError(f"not a text: {text!r}")
        body = text.replace(" ", "").lower()
        if body in ("", "none"):
            return cls()
        layers: dict[str, set[int]] = {"a": set(), "m": set()}
        for item in body.replace(",", "+").split("+"):
            match = _ITEM.match(item)
            if match is None:
                raise ValueError(f"'{item}' is not an item of {GRAMMAR}")
            kind, lo, hi = match.group(1), int(match.group(2)), int(match.group(3) or match.group(2))
            if lo < 1 or hi < lo:
                raise ValueError(f"'{item}': layers are 1-indexed and a range runs upwards")
            layers[kind].update(range(lo, hi + 1))
        return cls(frozenset(layers["a"]), frozenset(layers["m"]))

    @classmethod
    def from_mask(cls, mask: Sequence[bool], num_layers: int) -> SkipSet:
        """From 2L booleans: layer l's attention at index 2(l-1), its MLP at 2(l-1) + 1."""
        if len(mask) != 2 * num_layers:
            raise ValueError(f"a mask of {len(mask)} booleans for {num_layers} layers (needs {2 * num_layers})")
        attention = frozenset(i // 2 + 1 for i, on in enumerate(mask) if on and i % 2 == 0)
        return cls(attention, frozenset(i // 2 + 1 for i, on in enumerate(mask) if on and i % 2 == 1))

    def mask(self, num_layers: int) -> list[bool]:
        return [
            layer in (self.attention if i % 2 == 0 else self.mlp) for layer in range(1, num_layers + 1) for i in (0, 1)
        ]

    def __len__(self) -> int:
        return len(self.attention) + len(self.mlp)

    @property
    def max_layer(self) -> int:
        return max([*self.attention, *self.mlp], default=0)

    def ratio(self, num_layers: int) -> float:
        """|S| / 2L: the fraction of the model's sublayers bypassed."""
        return len(self) / (2 * num_layers)

    def text(self) -> str:
        """The canonical text."""
        items = [(lo, kind, hi) for kind in KINDS for lo, hi in _runs(self.attention if kind == "a" else self.mlp)]
        items.sort(key=lambda t: (t[0], KINDS.index(t[1])))
        return "+".join(f"{kind}{lo}" if lo == hi else f"{kind}{lo}-{hi}" for lo, kind, hi in items) or "none"

    def __str__(self) -> str:
        return self.text()


def _runs(layers: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted layers as maximal runs (lo, hi) of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], layer)
        else:
            runs.append((layer, layer))
    return runs


def canonical(text: str) -> str:
    """The canonical text of a skip set's text (ValueError when it does not parse)."""
    return SkipSet.parse(text).text()
