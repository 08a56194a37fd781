"""Model adapter: the one place that knows where a model keeps its parts and how its cache works.

Everything else (prefill, masks, RoPE, attention, experts, state-space scans) runs through the
model's own forward; the adapter only names modules and adds what a forward does not expose:
the logit lens ``z_l = head(final_norm(h_l))`` with the model's own logit transforms, per-layer
hidden-state capture, and the cache edits early exit needs (fill skipped layers' K/V, overwrite
a batch row's last position, crop back). Parts are found from the model's structure
(``sweep.models._parts``); ``sweep.config.families`` names fast paths and overrides only. Two K/V fills:

- ``fast``: the stacked projection of ``sweep.models._kvfill`` (one matmul for all skipped layers),
  for model types with a ``FAST_KV`` row;
- ``generic``: each skipped layer's own modules, through ``filling`` (``sweep.models._layerfill``).

Which one runs (``kv_path``) is what the fidelity check at load found exact; None refuses
kv_policy=propagate. Hooks and patches are installed in context managers that restore in
``finally``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterator, TypeVar

import torch

from sweep.errors import ConfigError
from sweep.config.families import FAST_KV, FastKV
from sweep.models._kvfill import LayerKV, StackedKV
from sweep.models._layerfill import filling
from sweep.models._parts import apply_scales, find_parts, text_config

T = TypeVar("T")

KINDS = ("attention", "ssm", "hybrid")  # every layer caches K/V; no layer does; some layers keep a recurrent state


class StepExit(Exception):
    """Unwinds the model's forward after the exit layer (raised by hooks; the stepper catches it)."""


def get_by_path(root: Any, path: str) -> Any:
    """The attribute at a dotted key path below ``root`` (``"self_attn.k_proj"`` of a layer)."""
    return functools.reduce(getattr, path.split("."), root)


class Adapter:
    """Resolved parts of one loaded decoder-only causal LM."""

    def __init__(self, model: torch.nn.Module, *, where: str) -> None:
        self.model, self.where = model, where
        self.config = text_config(model)
        parts = find_parts(model, where=where)
        self.decoder, self.layers, self.layers_path = parts.decoder, parts.layers, parts.layers_path
        self.norm, self.lm_head, self.scales = parts.norm, parts.head, parts.scales
        self.embed = model.get_input_embeddings()
        self.fast: FastKV | None = FAST_KV.get(self.config.model_type)
        self.kind = _kind(self.new_cache())
        self.kv_path: str | None = None  # set by the fidelity check: fast | generic | None (propagate refused)
        accepted = inspect.signature(model.forward).parameters
        self._takes = {k for k in ("logits_to_keep", "attention_mask", "position_ids") if k in accepted}
        self._stacked_kv: StackedKV | None = None  # built on the first fast K/V fill
        self._derived: dict = {}  # values derived from this model's weights (see ``derived``)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def path(self) -> str:
        """Which adapter path the K/V fill takes: fast, generic, or none (no fill: kv_policy=propagate refused)."""
        return self.kv_path or "none"

    def new_cache(self, record: int | None = None):
        """The model's own cache. ``record`` (a count of positions): sliding-window and state-space layers keep their
        past until the next ``crop_cache`` (transformers' past recording), each state-space layer the recurrent states
        of its last ``record`` positions of a forward, so a crop of up to that many positions rolls them back."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if record is not None:
            cache.activate_past_recording(recurrent_states_to_keep=record)
        return cache

    def forward(
        self,
        input_ids: torch.Tensor,
        cache,
        *,
        logits_to_keep: int = 1,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's own full-depth forward with a cache; returns the kept logits.

        A left-padded batch passes ``attention_mask`` (batch, cached + new positions; 0 on
        padding) and ``position_ids`` (batch, new positions: each row's own positions, from 0
        at its first real token). The model builds its causal, sliding-window and padding
        masks from them (transformers' ``masking_utils``) and its positions,
        so every row sees exactly what it would see alone. Arguments the model's forward does
        not name are not passed (a state-space model takes no positions).
        """
        given = {"logits_to_keep": logits_to_keep, "attention_mask": attention_mask, "position_ids": position_ids}
        kwargs = {k: v for k, v in given.items() if k in self._takes and (v is not None or k == "logits_to_keep")}
        logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, **kwargs).logits
        if "logits_to_keep" not in self._takes and logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return logits

    def lens(self, h: torch.Tensor) -> torch.Tensor:
        """Early-exit logits of a residual stream: the model's own final norm and head."""
        return self.head(self.norm(h))

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """The model's head on final-normed states, with its logit transforms (softcapping, scales)."""
        return apply_scales(self.lm_head(normed), self.scales)

    @contextlib.contextmanager
    def capture_rope(self) -> Iterator[dict]:
        """Record the (cos, sin) the model's own rotary embedding computes each forward (the fast
        K/V fill reads them). Keys are the ``layer_type`` argument (Gemma3 computes one pair per
        type) or None. Nothing is recorded for a model type without a fast path."""
        captured: dict = {}
        rotary = getattr(self.decoder, "rotary_emb", None) if self.fast is not None else None
        if rotary is None:
            yield captured
            return

        def keep(_module, args, kwargs, output):
            layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")
            captured[layer_type] = output

        handle = rotary.register_forward_hook(keep, with_kwargs=True)
        try:
            yield captured
        finally:
            handle.remove()

    def fill_kv(self, h: torch.Tensor, cache, layers: range, rope: dict) -> None:
        """Append K/V computed from ``h`` (batch, positions, hidden) to ``layers`` (0-based, a suffix):
        the fast path's CALM-style propagation (input norm, K and V projections, K norm, RoPE on
        K; one matmul for all layers). The generic path fills inside the forward (``filling``)."""
        k, v = self.stacked_kv().project(h, layers.start, layers.stop, rope)
        for i, layer in enumerate(layers):
            cache.update(k[:, :, i].transpose(1, 2), v[:, :, i].transpose(1, 2), layer)

    def overwrite_kv(
        self, h: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, cache, stop: int, rope: dict
    ) -> None:
        """Replace the last position's K/V of layers starts[i]..stop-1 of batch row rows[i] with
        the projections of h[i] (len(rows), 1, hidden): rows that exited earlier than the batch
        stopped (fast path). One matmul over the suffix from the earliest start serves every row."""
        lo = int(starts.min())
        k, v = self.stacked_kv().project_rows(h, rows, lo, stop, rope)
        for i, layer in enumerate(range(lo, stop)):
            sel = (starts <= layer).nonzero().flatten()
            if len(sel) == 0:
                continue
            entry, target = cache.layers[layer], rows[sel]
            entry.keys[target, :, -1:, :] = k[sel, :, i].transpose(1, 2)
            entry.values[target, :, -1:, :] = v[sel, :, i].transpose(1, 2)

    def filling(self, state, *, unwind: bool = True):
        """The generic K/V fill for the decode steps inside the block: every decoder layer's forward
        patched so that rows ``state`` says have exited (``state.fill_source(layer)``) are computed
        from their h at the exit; once every row has, a layer computes only its K/V, and the last
        one unwinds the forward (``StepExit``) when ``unwind``."""
        return filling(self.layers, state, StepExit if unwind else None)

    def sublayers(self, index: int) -> dict:
        """Decoder layer ``index``'s (0-based) attention (``"a"``) and MLP (``"m"``) modules, found from its
        structure (``sweep.models._bypass``); a one-line refusal where a layer has not one of each."""
        from sweep.models._bypass import sublayers

        return self.derived(("sublayers", index), lambda: sublayers(self.layers[index], where=self.where, index=index))

    def sublayer(self, index: int, kind: str):
        """Layer ``index``'s (0-based) sublayer of ``kind`` (a, m, s), or a one-line refusal naming what it has."""
        found = self.sublayers(index)
        if kind not in found:
            names = {"a": "attention", "m": "MLP", "s": "state-space mixer"}
            has = ", ".join(f"{k} ({names[k]})" for k in found) or "none"
            raise ConfigError(
                f"gate.skip: {self.where}: layer {index + 1} has no {names[kind]} sublayer ({kind}{index + 1}); "
                f"it has {has}"
            )
        return found[kind]

    def attention_sublayers(self) -> list[int]:
        """The layers (1-indexed) with an attention sublayer: what gate.skip=attention-free bypasses."""
        return [i + 1 for i in range(self.num_layers) if "a" in self.sublayers(i)]

    def skippable(self) -> list[str]:
        """The sublayers a skip set may bypass, as skip-set items, layer by layer (a, m, s within a layer): every
        attention and MLP, and each state-space mixer that has its cache layer to itself (one beside attention
        would leave that layer's K/V out of step: ``sweep.decode.speculative.SkipDraft`` refuses it)."""
        names = []
        for i in range(self.num_layers):
            found = self.sublayers(i)
            names += [f"{k}{i + 1}" for k in ("a", "m", "s") if k in found and not (k == "s" and "a" in found)]
        return names

    @contextlib.contextmanager
    def bypassing(self, skip) -> Iterator[None]:
        """Decode steps inside the block run with the sublayers of ``skip`` (a ``sweep.gates.skipset.SkipSet``,
        1-indexed layers) bypassed through the residual: each returns zeros, so the residual passes on
        unchanged; a bypassed attention appends zero K/V that nothing reads (``sweep.models._bypass``)."""
        from sweep.models._bypass import bypassing, output_shapes

        chosen = [self.sublayer(layer - 1, kind) for kind in ("a", "m", "s") for layer in sorted(skip.layers_of(kind))]
        every = [m for i in range(self.num_layers) for m in self.sublayers(i).values()]
        shapes = self.derived(("sublayer_outputs",), lambda: output_shapes(self.model, every, self.embed.weight.device))
        with bypassing(chosen, shapes):
            yield

    def last_kv(self, cache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s cached K and V at the last position: (B, kv_heads, 1, head_dim) each."""
        entry = cache.layers[index]
        return entry.keys[:, :, -1:, :], entry.values[:, :, -1:, :]

    def attention_layers(self) -> list[int]:
        """The layers (0-based) that cache K/V (every layer of an attention model; none of a state-space one)."""
        return [i for i, entry in enumerate(self.new_cache().layers) if hasattr(entry, "keys")]

    def keep_rows(self, cache, rows: torch.Tensor) -> bool:
        """Keep only ``rows`` of a batch's cache (sequences that ended dropped); False, and the cache as it was,
        where a layer holds more than K/V per row (a state-space layer's recurrent state): the batch keeps them."""
        from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin as Recurrent

        if not all(isinstance(x, DynamicLayer) and not isinstance(x, Recurrent) for x in cache.layers):
            return False
        cache.batch_select_indices(rows)
        return True

    def crop_cache(self, cache, length: int) -> None:
        """Roll every layer back to ``length`` positions: K/V beyond them dropped, a sliding window and a state-space
        layer's state restored from its recorded past (a cache made with ``new_cache(record=...)``); a recording layer
        already at ``length`` trims what it kept for a crop. A layer the draft did not run (shorter) stays."""
        for layer in cache.layers:
            held = _layer_length(layer)
            if held is None:
                continue
            if held > length:
                layer.crop(length - held)  # a negative count: the positions to remove (every layer kind takes it)
            elif held == length and getattr(layer, "record_past", False):
                layer.crop(0)

    def layer_kv(self, index: int) -> LayerKV:
        """The parts of decoder layer ``index`` the fast K/V fill reads, by the fast path's key paths."""
        fast, layer = self.fast, self.layers[index]
        key_norm = None if fast.k_norm is None else get_by_path(layer, fast.k_norm)
        return LayerKV(
            get_by_path(layer, fast.input_norm),
            get_by_path(layer, fast.k_proj),
            get_by_path(layer, fast.v_proj),
            key_norm,
        )

    def derived(self, key: tuple, build: Callable[[], T]) -> T:
        """``build()``, computed once per loaded model and kept with it (the lm_head's PCA basis,
        the measured cost model): it leaves with the model when the model cache evicts it, so
        a later model can never be handed another's (unlike a module dict keyed by ``id()``)."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def stacked_kv(self) -> StackedKV:
        if self._stacked_kv is None:
            cfg = self.config
            self._stacked_kv = StackedKV(
                [self.layer_kv(i) for i in range(self.num_layers)],
                head_dim=get_by_path(self.layers[0], self.fast.head_dim),
                eps=float(cfg.rms_norm_eps),
                norm_offset=self.fast.norm_offset,
                layer_types=getattr(cfg, "layer_types", None),
            )
        return self._stacked_kv

    @contextlib.contextmanager
    def capture_hidden(self) -> Iterator[list[torch.Tensor]]:
        """Collect ``[h_0, h_1, ..., h_L]``: the first layer's input (the embeddings with whatever
        scale or position embedding the model adds), then each layer's output.

        h_L is the raw residual before the final norm, unlike HF's last hidden state.
        """
        captured: list[torch.Tensor] = []

        def keep_input(_module, args, kwargs):
            captured.append(args[0] if args else kwargs["hidden_states"])

        def keep(_module, _inputs, output):
            captured.append(output[0] if isinstance(output, tuple) else output)

        handles = [self.layers[0].register_forward_pre_hook(keep_input, with_kwargs=True)]
        handles += [layer.register_forward_hook(keep) for layer in self.layers]
        try:
            yield captured
        finally:
            for h in handles:
                h.remove()


def _kind(cache) -> str:
    """attention, ssm or hybrid, from the layer types of the model's own cache."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    recurrent = [isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers]
    if not any(recurrent):
        return "attention"
    return "ssm" if all(cache.is_linear) else "hybrid"


def _layer_length(layer) -> int | None:
    """The positions a cache layer holds (None before its first update)."""
    if hasattr(layer, "cumulative_length_linear"):  # a state-space layer (alone or beside attention)
        if not any(getattr(layer, "is_conv_states_initialized", {}).values()):
            return None
        return int(layer.cumulative_length_linear)
    if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
        return None
    if hasattr(layer, "cumulative_length"):  # a sliding window: what it has seen, not what it keeps
        return int(layer.cumulative_length)
    return int(layer.keys.shape[-2])
