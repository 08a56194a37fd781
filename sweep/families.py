"""The supported model families, as data: one row per family, keyed by name.

A family is matched from a model's ``config.model_type``. What differs between
families here is what the early-exit engine must know to touch a layer's K/V
projections; everything else goes through the model's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweep.errors import InputError


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # HF ``config.model_type`` values of this family
    config_class: str  # transformers config class used for tiny random models
    k_norm: bool  # keys pass through a per-head RMSNorm (``self_attn.k_norm``) before RoPE
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): 1.0 for Gemma, 0.0 for the rest


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", ("llama",), "LlamaConfig", k_norm=False),
        Family("mistral", ("mistral",), "MistralConfig", k_norm=False),
        Family("qwen2", ("qwen2",), "Qwen2Config", k_norm=False),
        Family("qwen3", ("qwen3",), "Qwen3Config", k_norm=True),
        Family("gemma3", ("gemma3_text",), "Gemma3TextConfig", k_norm=True, norm_offset=1.0),
    )
}


def family_for(model_type: str, *, where: str) -> Family:
    """The family of an HF ``model_type``; unknown types name the supported ones."""
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    supported = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES.values())
    raise InputError(f"{where}: model_type '{model_type}' is not a supported family; supported: {supported}")
