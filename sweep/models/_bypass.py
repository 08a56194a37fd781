"""Bypassing sublayers through the residual: the skip-set draft of self-speculation.

A decoder layer adds its attention's and its MLP's outputs to the residual stream (before or after
their own norms, in sequence or in parallel). A bypassed sublayer returns zeros instead of running:
the residual passes through unchanged (a norm of zeros is zeros), a bypassed attention appends zero K/V
that nothing reads (its layer stays as long as the others, so the masks fit), and everything else is the model's
own forward. Sublayers are found from the layer's structure:
its one child that is an attention module and its one child that is an MLP or mixture of experts.
Each bypassed module's ``forward`` is an instance attribute over the class's, removed in ``finally``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from sweep.errors import ConfigError

_ATTENTION = ("attention", "attn")
_MLP = ("mlp", "moe", "feedforward", "feed_forward", "experts", "ffn")
_MIXER = ("mamba", "mixer")  # whole words of the class name: not "ssm" (GptOssMLP holds it)


def _is(module_name: str, module: torch.nn.Module, words: tuple[str, ...]) -> bool:
    cls = type(module).__name__.lower()
    return any(w in cls for w in words) or module_name.lower() in words


def sublayers(layer: torch.nn.Module, *, where: str, index: int) -> dict[str, torch.nn.Module]:
    """The sublayers a skip set can name in one decoder layer: ``a`` (attention), ``s`` (a state-space mixer) and
    ``m`` (MLP or mixture of experts), those it has; more than one of a kind is a one-line refusal."""
    children = [(n, m) for n, m in layer.named_children() if "norm" not in type(m).__name__.lower()]
    found = {
        "a": [m for n, m in children if _is(n, m, _ATTENTION)],
        "s": [m for n, m in children if _is(n, m, _MIXER) and not _is(n, m, _ATTENTION)],
        "m": [m for n, m in children if _is(n, m, _MLP) and not _is(n, m, _ATTENTION) and not _is(n, m, _MIXER)],
    }
    if any(len(v) > 1 for v in found.values()) or not any(found.values()):
        names = ", ".join(f"{n} ({type(m).__name__})" for n, m in layer.named_children())
        raise ConfigError(
            f"gate=skip: {where}: decoder layer {index + 1} has {len(found['a'])} attention, {len(found['s'])} "
            f"state-space and {len(found['m'])} MLP sublayers among its parts ({names}); a skip set names at most "
            "one of each"
        )
    return {kind: v[0] for kind, v in found.items() if v}


def _zeros_like_output(module: torch.nn.Module, shapes: dict):
    """A forward that returns zeros in the structure the module's own forward returns (``shapes``:
    module -> None for a tensor, else the tuple's length), without running the module."""

    def bypassed(*args, **kwargs):
        x = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
        zeros = torch.zeros_like(x)
        _keep_in_step(module, kwargs, x.shape[1])
        n = shapes[module]
        return zeros if n is None else (zeros, *([None] * (n - 1)))

    return bypassed


def _keep_in_step(module: torch.nn.Module, kwargs: dict, positions: int) -> None:
    """A bypassed attention still advances its cache layer by ``positions`` (zero K/V, never read: the draft bypasses
    it at every step, and verification crops the drafted positions away), so every layer holds the same length and
    the masks the model builds from one layer's length (a sliding window's among them) fit every layer."""
    cache = next((kwargs[k] for k in ("cache", "past_key_values", "past_key_value") if kwargs.get(k) is not None), None)
    index = getattr(module, "layer_idx", None)
    if cache is None or index is None or not hasattr(cache, "layers") or index >= len(cache.layers):
        return
    layer = cache.layers[index]
    keys = getattr(layer, "keys", None)
    if keys is None or not getattr(layer, "is_initialized", True) or keys.dim() != 4:
        return
    b, heads, _, dim = keys.shape
    filler = torch.zeros(b, heads, positions, dim, dtype=keys.dtype, device=keys.device)
    cache.update(filler, filler.clone(), index)


def output_shapes(model: torch.nn.Module, modules: list[torch.nn.Module], device) -> dict:
    """What each module's forward returns (None: a tensor; n: a tuple of n), from one real forward."""
    shapes: dict = {}

    def keep(module, _args, output):
        shapes[module] = len(output) if isinstance(output, tuple) else None

    handles = [m.register_forward_hook(keep) for m in modules]
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1, 2]], device=device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return shapes


@contextlib.contextmanager
def bypassing(modules: list[torch.nn.Module], shapes: dict) -> Iterator[None]:
    """Inside the block the ``modules`` return zeros of their own output's structure."""
    patched = []
    try:
        for module in modules:
            module.forward = _zeros_like_output(module, shapes)
            patched.append(module)
        yield
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)
