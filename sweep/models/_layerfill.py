"""The generic K/V fill: a skipped layer's K/V computed by that layer's own modules.

A token that exits after layer l leaves layers l+1..L without K/V for its position; CALM fills
them from h_l. Any attention layer (fused QKV, a K norm over the whole projection, norms after
attention, LayerNorm, partial or absent RoPE, sinks, sliding windows) computes its K/V in its
own forward and hands them to ``cache.update``: so the fill runs that forward on h_l and stops it
there. During the decode steps inside ``filling``, each decoder layer's ``forward`` is wrapped
(the model's own decoder loop still calls every layer with its own mask and positions):

- rows the step state says exited before this layer (``state.fill_source(layer)``) enter it with
  their h at the exit instead of the hidden state (a batch still running for other rows computes
  their K/V from it as it computes the others');
- once every row has exited (``state.exit_layer`` is set), the layer runs only until its
  ``cache.update`` (which appends as the layer itself would) and is then stopped; after the last
  layer's fill the forward unwinds with ``unwind`` (the final norm and head never run).

Each wrapped ``forward`` is an instance attribute over the class's method, removed in ``finally``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class _Filled(Exception):
    """Stops a layer's forward right after its cache update (never escapes this module)."""


class NoKVWritten(RuntimeError):
    """A layer ran to its end without handing K/V to the cache (it has no attention)."""


def _cache_of(args: tuple, kwargs: dict):
    from transformers import Cache

    for value in (*kwargs.values(), *args):
        if isinstance(value, Cache):
            return value
    return None


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def kv_only(forward, args: tuple, kwargs: dict) -> None:
    """Run a layer's ``forward`` until it hands its K/V to the cache (appended there), then stop it."""
    cache = _cache_of(args, kwargs)
    if cache is None:
        raise NoKVWritten("the layer was called without a cache")
    update = cache.update

    def update_then_stop(*a, **kw):
        update(*a, **kw)
        raise _Filled

    cache.update = update_then_stop
    try:
        forward(*args, **kwargs)
    except _Filled:
        return
    finally:
        del cache.update
    raise NoKVWritten("the layer wrote no K/V to the cache")


def _wrapped(forward, layer: int, last: bool, state, unwind):
    def fill_forward(*args, **kwargs):
        source = state.fill_source(layer)
        if source is None:
            return forward(*args, **kwargs)
        rows, h = source
        hidden = _hidden(args, kwargs)
        x = h.to(hidden.dtype) if rows is None else torch.where(rows[:, None, None], h.to(hidden.dtype), hidden)
        args, kwargs = _with_hidden(args, kwargs, x)
        if state.exit_layer is None:  # other rows still run: the layer computes the exited rows' K/V from x
            return forward(*args, **kwargs)
        kv_only(forward, args, kwargs)
        if last and unwind is not None:
            raise unwind
        return x  # what the decoder passes on to the next layer (which fills from its source too)

    return fill_forward


@contextlib.contextmanager
def filling(layers: torch.nn.ModuleList, state, unwind: type[BaseException] | None) -> Iterator[None]:
    """Wrap every layer's forward for the generic fill (layers are 1-indexed for ``state``)."""
    patched = []
    try:
        for index, module in enumerate(layers):
            module.forward = _wrapped(module.forward, index + 1, index == len(layers) - 1, state, unwind)
            patched.append(module)
        yield
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)
