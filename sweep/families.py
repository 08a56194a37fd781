"""The supported model families, as data: one row per family, keyed by name.

A family is matched from a model's ``config.model_type``. What differs between
families here is what the early-exit engine must know to touch a layer's K/V
projections; everything else goes through the model's own modules. Parts are named by
key paths from a decoder layer (``"self_attn.k_proj"``), resolved by the adapter alone
(``sweep.models._adapter.get_by_path``): no other module names a model's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweep.errors import InputError


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # HF ``config.model_type`` values of this family
    config_class: str  # transformers config class used for tiny random models
    k_norm: str | None = None  # the per-head RMSNorm keys pass through before RoPE, if any
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): 1.0 for Gemma, 0.0 for the rest
    # key paths of the parts a K/V fill recomputes, from a decoder layer
    input_norm: str = "input_layernorm"  # the RMSNorm before attention
    k_proj: str = "self_attn.k_proj"
    v_proj: str = "self_attn.v_proj"
    head_dim: str = "self_attn.head_dim"  # an int attribute of the attention module


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", ("llama",), "LlamaConfig"),
        Family("mistral", ("mistral",), "MistralConfig"),
        Family("qwen2", ("qwen2",), "Qwen2Config"),
        Family("qwen3", ("qwen3",), "Qwen3Config", k_norm="self_attn.k_norm"),
        Family("gemma3", ("gemma3_text",), "Gemma3TextConfig", k_norm="self_attn.k_norm", norm_offset=1.0),
    )
}


def family_for(model_type: str, *, where: str) -> Family:
    """The family of an HF ``model_type``; unknown types name the supported ones."""
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    supported = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES.values())
    raise InputError(f"{where}: model_type '{model_type}' is not a supported family; supported: {supported}")
