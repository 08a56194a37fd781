"""Skip sets: which sublayers a skip-set draft bypasses, and their one canonical text form.

A skip set S is a set of (layer, sublayer) with layers 1-indexed and sublayer attention (``a``), MLP (``m``) or a
state-space mixer (``s``: a hybrid's Mamba block, beside or instead of attention). Its text is ``+``-separated
items ``a<layers>`` / ``m<layers>`` / ``s<layers>``, where ``<layers>`` is one layer or a range ``i-j``:
``a3+m3+a5-9`` bypasses the attention of layers 3 and 5 to 9 and the MLP of layer 3 (``+``, not a comma, so that a
Hydra override takes it unquoted; commas parse too). ``none`` (or an empty text) is the empty set;
``attention-free`` every attention sublayer the model has (a hybrid's state-space path alone, resolved on the
model); ``file:PATH`` reads a set published the way Draft&Verify publishes one (JSON, 0-based indices:
``from_published``). The canonical form merges consecutive layers into ranges and orders items by their first
layer, attention before MLP before mixer, so one set has one text (the ``skip`` column, the trial id's input). Its
skip ratio is |S| / 2L.

Torch-free: the config is validated with it before any model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, NamedTuple

KINDS = ("a", "m", "s")  # attention, MLP, state-space mixer
GRAMMAR = (
    "'+'-separated a<layers>/m<layers>/s<layers> items (attention, MLP or state-space mixer of layers 'i' or 'i-j', "
    "1-indexed), 'attention-free' (every attention sublayer), a published set 'file:PATH', or 'none'"
)
ATTENTION_FREE = "attention-free"  # every attention sublayer bypassed: a hybrid's state-space path alone
MAX_LAYER = 10_000  # more layers than any decoder has: a number past it is a typo, not a model
_ITEM = re.compile(r"^([ams])(\d+)(?:-(\d+))?$")


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
    mixer: frozenset[int] = frozenset()  # state-space mixers (a hybrid's beside or instead of attention)
    every_attention: bool = False  # attention-free: every attention sublayer the model has (``resolve``)

    def resolve(self, attention_layers: Iterable[int]) -> SkipSet:
        """The concrete set on a model whose layers ``attention_layers`` (1-indexed) have an attention sublayer:
        attention-free names them all; any other set is itself."""
        if not self.every_attention:
            return self
        return SkipSet(frozenset(attention_layers), self.mlp, self.mixer)

    @classmethod
    def parse(cls, text: str) -> SkipSet:
        """The set a text names; ValueError (saying what is wrong with it) when it does not parse."""
        if not isinstance(text, str):
            raise ValueError(f"not a text: {text!r}")
        if text.strip().startswith("file:"):
            return cls.from_published(text.strip()[len("file:") :])
        body = text.replace(" ", "").lower()
        if body in ("", "none"):
            return cls()
        if body == ATTENTION_FREE:
            return cls(every_attention=True)
        layers: dict[str, set[int]] = {"a": set(), "m": set(), "s": set()}
        for item in body.replace(",", "+").split("+"):
            match = _ITEM.match(item)
            if match is None:
                raise ValueError(f"'{item}' is not an item")  # (the grammar is the key's allowed text)
            kind, lo, hi = match.group(1), int(match.group(2)), int(match.group(3) or match.group(2))
            if lo < 1 or hi < lo:
                raise ValueError(f"'{item}': layers are 1-indexed and a range runs upwards")
            if hi > MAX_LAYER:  # (a range is expanded: a huge one would take the machine's memory)
                raise ValueError(f"'{item}': names layer {hi}; a layer number is at most {MAX_LAYER}")
            layers[kind].update(range(lo, hi + 1))
        return cls(frozenset(layers["a"]), frozenset(layers["m"]), frozenset(layers["s"]))

    @classmethod
    def from_published(cls, where: str) -> SkipSet:
        """A skip set as Draft&Verify (arXiv 2309.08168) publishes one: a JSON file of 0-based layer indices,
        ``{"attention": [...], "mlp": [...]}``, or a mapping of model names to such sets (``PATH@NAME`` picks one;
        a file of one needs no name). The path is read as every path a user names (``~`` and environment variables
        expanded once), and only a regular file of at most ``userfiles.CAP`` bytes nested at most
        ``userfiles.MAX_DEPTH`` deep is read (a FIFO or a device is never opened). A file that cannot be read or does
        not hold a skip set is one ConfigError line."""
        from sweep.errors import ConfigError, first_line
        from sweep.userfiles import expand, read_json, unset

        import os

        missing = unset(where)
        if missing:
            raise ConfigError(f"gate.skip=file:{where}: the environment variable {missing[0]} is not set")
        # PATH@NAME at the last '@', unless the whole names a file (a path holding '@')
        path, _, name = where.rpartition("@") if "@" in where and not os.path.isfile(expand(where)) else (where, "", "")
        key = f"gate.skip=file:{where}"
        try:
            data = read_json(expand(path))
        except FileNotFoundError:
            raise ConfigError(f"{key}: no such file") from None
        except (OSError, ValueError) as exc:  # not a regular file, over the cap, too deep, not UTF-8 JSON
            raise ConfigError(f"{key}: cannot read a JSON skip set ({first_line(exc)})") from None
        if isinstance(data, dict) and not ({"attention", "mlp"} & set(data)):
            names = sorted(data)
            if name:
                if name not in data:
                    raise ConfigError(f"{key}: no set named {name!r}; the file has {', '.join(names)}")
                data = data[name]
            elif len(names) == 1:
                data = data[names[0]]
            else:
                raise ConfigError(
                    f"{key}: the file holds {len(names)} sets; name one: file:{path}@NAME ({', '.join(names)})"
                )
        elif name:  # one set, not named: a name would pick nothing
            raise ConfigError(f"{key}: the file holds one set, not a mapping of named sets; drop @{name}")
        if not isinstance(data, dict) or not ({"attention", "mlp"} >= set(data)) or not data:
            raise ConfigError(f'{key}: expected {{"attention": [...], "mlp": [...]}} of 0-based layer indices')
        layers = {}
        for kind in ("attention", "mlp"):
            values = data.get(kind, [])
            if not isinstance(values, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_LAYER for v in values
            ):
                raise ConfigError(
                    f"{key}: {kind} must be a list of 0-based layer indices (integers in 0..{MAX_LAYER - 1})"
                )
            layers[kind] = frozenset(v + 1 for v in values)
        return cls(layers["attention"], layers["mlp"])

    def published(self) -> dict[str, list[int]]:
        """This set as Draft&Verify publishes one: 0-based attention and MLP layer indices."""
        return {"attention": sorted(i - 1 for i in self.attention), "mlp": sorted(i - 1 for i in self.mlp)}

    def __len__(self) -> int:
        return len(self.attention) + len(self.mlp) + len(self.mixer)

    @property
    def max_layer(self) -> int:
        return max([*self.attention, *self.mlp, *self.mixer], default=0)

    def ratio(self, num_layers: int, sublayers: int | None = None) -> float:
        """|S| / the model's skippable sublayers (``Adapter.skippable``; 2L, an attention and an MLP per layer, where
        not given): the fraction of them bypassed (a resolved set)."""
        return len(self) / (sublayers or 2 * num_layers)

    def layers_of(self, kind: str) -> frozenset[int]:
        return {"a": self.attention, "m": self.mlp, "s": self.mixer}[kind]

    def text(self) -> str:
        """The canonical text."""
        if self.every_attention:
            return ATTENTION_FREE
        items = [(lo, kind, hi) for kind in KINDS for lo, hi in _runs(self.layers_of(kind))]
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
