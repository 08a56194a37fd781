"""Family adapter: the one place that knows where a model keeps its parts.

Everything else (prefill, masks, RoPE, attention) runs through the model's own
forward; the adapter only names modules and adds what a forward does not expose:
the logit lens ``z_l = lm_head(final_norm(h_l))`` and per-layer hidden-state capture.
Hooks are installed in context managers that remove them in ``finally``.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

import torch

from sweep.errors import InputError
from sweep.families import Family, family_for
from sweep.models._kvfill import StackedKV

T = TypeVar("T")


class Adapter:
    """Resolved modules of one loaded causal LM of a supported family."""

    def __init__(self, model: torch.nn.Module, *, where: str) -> None:
        self.model = model
        self.family: Family = family_for(model.config.model_type, where=where)
        decoder = model.get_decoder()
        for attr in ("layers", "norm", "rotary_emb"):
            if not hasattr(decoder, attr):
                raise InputError(f"{where}: {type(decoder).__name__} has no '{attr}'; this transformers release moved it")
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
        out = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep,
                         attention_mask=attention_mask, position_ids=position_ids)
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
        self.stacked_kv().fill(h, cache, layers.start, layers.stop, rope)

    def derived(self, key: tuple, build: Callable[[], T]) -> T:
        """``build()``, computed once per loaded model and kept with it (the lm_head's PCA basis,
        the measured cost model): it leaves with the model when the model cache evicts it, so
        a later model can never be handed another's (unlike a module dict keyed by ``id()``)."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def stacked_kv(self) -> StackedKV:
        if self._stacked_kv is None:
            self._stacked_kv = StackedKV(self)
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

