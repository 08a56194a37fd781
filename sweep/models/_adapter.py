"""Family adapter: the one place that knows where a model keeps its parts.

Everything else (prefill, masks, RoPE, attention) runs through the model's own
forward; the adapter only names modules and adds what a forward does not expose:
the logit lens ``z_l = lm_head(final_norm(h_l))``, per-layer hidden-state capture, and
the K/V cache edits early exit needs (fill skipped layers, overwrite a batch row's last
position, crop back). A layer's parts are found by the family table's key paths
(``get_by_path``); the cache's internals are touched here and nowhere else.
Hooks are installed in context managers that remove them in ``finally``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import torch

from sweep.errors import InputError
from sweep.families import Family, family_for
from sweep.models._kvfill import LayerKV, StackedKV

T = TypeVar("T")


def get_by_path(root: Any, path: str) -> Any:
    """The attribute at a dotted key path below ``root`` (``"self_attn.k_proj"`` of a layer)."""
    return functools.reduce(getattr, path.split("."), root)


class Adapter:
    """Resolved modules of one loaded causal LM of a supported family."""

    def __init__(self, model: torch.nn.Module, *, where: str) -> None:
        self.model = model
        self.family: Family = family_for(model.config.model_type, where=where)
        decoder = model.get_decoder()
        for attr in ("layers", "norm", "rotary_emb"):
            if not hasattr(decoder, attr):
                raise InputError(
                    f"{where}: {type(decoder).__name__} has no '{attr}'; this transformers release moved it"
                )
        self.decoder = decoder
        self.layers = decoder.layers
        self.norm = decoder.norm
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self._stacked_kv: StackedKV | None = None  # built on the first K/V fill
        self._derived: dict = {}  # values derived from this model's weights (see ``derived``)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache,
        *,
        logits_to_keep: int = 1,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's own full-depth forward with a KV cache; returns the kept logits.

        A left-padded batch passes ``attention_mask`` (batch, cached + new positions; 0 on
        padding) and ``position_ids`` (batch, new positions: each row's own positions, from 0
        at its first real token). The model builds its causal, sliding-window and padding
        masks from them (transformers' ``masking_utils``) and its RoPE from the positions,
        so every row sees exactly what it would see alone.
        """
        out = self.model(
            input_ids=input_ids,
            cache=cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        return out.logits

    def lens(self, h: torch.Tensor) -> torch.Tensor:
        """Early-exit logits of a residual stream: the model's own final norm and head."""
        return self.head(self.norm(h))

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        z = self.lm_head(normed)
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    @contextlib.contextmanager
    def capture_rope(self) -> Iterator[dict]:
        """Record the (cos, sin) the model's own rotary embedding computes each forward.

        Keys are the ``layer_type`` argument (Gemma3 computes one pair per type) or None.
        """
        captured: dict = {}

        def keep(_module, args, kwargs, output):
            layer_type = args[2] if len(args) > 2 else kwargs.get("layer_type")
            captured[layer_type] = output

        handle = self.decoder.rotary_emb.register_forward_hook(keep, with_kwargs=True)
        try:
            yield captured
        finally:
            handle.remove()

    def fill_kv(self, h: torch.Tensor, cache, layers: range, rope: dict) -> None:
        """Append K/V computed from ``h`` (batch, positions, hidden) to ``layers`` (0-based, a suffix).

        The CALM-style propagation for layers a token skipped: each layer's input norm, K
        and V projections (and K norm), RoPE on K; no attention, no MLP. ``rope`` comes
        from ``capture_rope``. One matmul for all layers (see ``_kvfill``).
        """
        k, v = self.stacked_kv().project(h, layers.start, layers.stop, rope)
        for i, layer in enumerate(layers):
            cache.update(k[:, :, i].transpose(1, 2), v[:, :, i].transpose(1, 2), layer)

    def overwrite_kv(
        self, h: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, cache, stop: int, rope: dict
    ) -> None:
        """Replace the last position's K/V of layers starts[i]..stop-1 of batch row rows[i] with
        the projections of h[i] (len(rows), 1, hidden): rows that exited earlier than the batch
        stopped. One matmul over the suffix from the earliest start serves every row."""
        lo = int(starts.min())
        k, v = self.stacked_kv().project_rows(h, rows, lo, stop, rope)
        for i, layer in enumerate(range(lo, stop)):
            sel = (starts <= layer).nonzero().flatten()
            if len(sel) == 0:
                continue
            entry, target = cache.layers[layer], rows[sel]
            entry.keys[target, :, -1:, :] = k[sel, :, i].transpose(1, 2)
            entry.values[target, :, -1:, :] = v[sel, :, i].transpose(1, 2)

    def crop_cache(self, cache, length: int) -> None:
        """Drop every layer's K/V beyond ``length`` positions (exact only without sliding-window
        layers: see ``cache_crops_exactly``)."""
        for layer in cache.layers:
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.shape[-2] > length:
                layer.crop(length - layer.keys.shape[-2])

    def cache_crops_exactly(self) -> bool:
        """Whether ``crop_cache`` restores exactly the cache of a shorter sequence: no layer
        slides its window (a sliding layer has already dropped what a crop would need back)."""
        return not any(self.new_cache().is_sliding)

    def layer_kv(self, index: int) -> LayerKV:
        """The parts of decoder layer ``index`` a K/V fill recomputes, by the family's key paths."""
        fam, layer = self.family, self.layers[index]
        key_norm = None if fam.k_norm is None else get_by_path(layer, fam.k_norm)
        return LayerKV(
            get_by_path(layer, fam.input_norm), get_by_path(layer, fam.k_proj), get_by_path(layer, fam.v_proj), key_norm
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
            cfg = self.model.config
            self._stacked_kv = StackedKV(
                [self.layer_kv(i) for i in range(self.num_layers)],
                head_dim=get_by_path(self.layers[0], self.family.head_dim),
                eps=float(cfg.rms_norm_eps),
                norm_offset=self.family.norm_offset,
                layer_types=getattr(cfg, "layer_types", None),
            )
        return self._stacked_kv

    @contextlib.contextmanager
    def capture_hidden(self) -> Iterator[list[torch.Tensor]]:
        """Collect ``[h_0, h_1, ..., h_L]`` (embedding output, then each layer's output).

        h_L is the raw residual before the final norm, unlike HF's last hidden state.
        """
        captured: list[torch.Tensor] = []

        def keep(_module, _inputs, output):
            captured.append(output[0] if isinstance(output, tuple) else output)

        handles = [self.embed.register_forward_hook(keep)]
        handles += [layer.register_forward_hook(keep) for layer in self.layers]
        try:
            yield captured
        finally:
            for h in handles:
                h.remove()
