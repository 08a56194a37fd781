"""Model families as data: fast paths, overrides, and the tiny random models tests build.

Any decoder-only causal LM loads through the generic path (``sweep.models._parts``): its
decoder layers, final norm and output head are found from the model's structure, and a
skipped layer's K/V are computed by the layer's own modules. This table names only what
is faster or different for some ``config.model_type``:

- ``FAST_KV``: the key paths (from a decoder layer) of the parts the stacked K/V fill
  projects in one matmul (``sweep.models._kvfill``): input RMSNorm, K and V projections,
  a per-head K norm, RoPE from the decoder's ``rotary_emb``. Used only where the fidelity
  check at load finds it exact; otherwise the generic fill runs.
- ``HEAD_SCALES``: logit transforms the model applies after its head that a config key names
  (softcapping, logit scales); the logit lens applies the same. The fidelity check at load
  compares the lens at layer L with the model's own logits, so a transform missing here is
  a refusal, never a silently wrong margin.
- ``TINY``: per family, the transformers config class and the values that make a seeded tiny
  random model of it exercise what the family does differently (tests and quick checks).

Torch-free: the config schema validates ``model.family`` against ``TINY``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FastKV:
    """Key paths of what the stacked K/V fill reads from a decoder layer."""

    input_norm: str = "input_layernorm"  # the RMSNorm before attention
    k_proj: str = "self_attn.k_proj"
    v_proj: str = "self_attn.v_proj"
    head_dim: str = "self_attn.head_dim"  # an int attribute of the attention module
    k_norm: str | None = None  # a per-head RMSNorm keys pass through before RoPE, if any
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): 1.0 for Gemma, 0.0 for the rest


_LLAMA = FastKV()
_QWEN3 = FastKV(k_norm="self_attn.k_norm")
_GEMMA = FastKV(norm_offset=1.0)
# HF model_type -> the stacked fill's parts (models whose attention is Llama's with these differences)
FAST_KV: dict[str, FastKV] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "mixtral": _LLAMA,
    "qwen2_moe": _LLAMA,
    "granite": _LLAMA,
    "qwen3": _QWEN3,
    "qwen3_moe": _QWEN3,
    "gemma2": _GEMMA,
    "gemma3_text": FastKV(k_norm="self_attn.k_norm", norm_offset=1.0),
}


@dataclass(frozen=True)
class HeadScale:
    """A transform the model applies to its head's logits, named by a (text) config key."""

    key: str
    op: str  # "softcap": c * tanh(z / c); "divide": z / c; "multiply": z * c


# the transforms a config key names, in the order a model applies them; an entry of
# HEAD_OVERRIDES replaces the whole list for a model_type whose key means something else
HEAD_SCALES: tuple[HeadScale, ...] = (
    HeadScale("logits_scaling", "divide"),  # Granite, GraniteMoE, MiniCPM3
    HeadScale("logit_scale", "multiply"),  # Cohere
    HeadScale("lm_head_multiplier", "multiply"),  # Falcon-H1
    HeadScale("final_logit_softcapping", "softcap"),  # Gemma 2, Gemma 3
)
HEAD_OVERRIDES: dict[str, tuple[HeadScale, ...]] = {
    "hyperclovax": (HeadScale("logits_scaling", "multiply"),),
}


@dataclass(frozen=True)
class Tiny:
    """A tiny random model of one family: its config class and what it sets beyond the common sizes."""

    config_class: str
    kind: str = "dense"  # dense | moe | ssm | hybrid (what the family is; tests pick their cases by it)
    extra: dict[str, Any] = field(default_factory=dict)  # config values (``{L}``: the layer count)
    multimodal: bool = False  # a vision-language wrapper whose text model is the decoder


_MOE = {"num_experts_per_tok": 2}
TINY: dict[str, Tiny] = {
    t[0]: t[1]
    for t in (
        ("llama", Tiny("LlamaConfig")),
        ("mistral", Tiny("MistralConfig", extra={"sliding_window": 64})),
        ("qwen2", Tiny("Qwen2Config")),
        ("qwen3", Tiny("Qwen3Config")),
        (
            "gemma3",
            Tiny(
                "Gemma3TextConfig",
                extra={"sliding_window": 16, "final_logit_softcapping": 30.0, "layer_types": "gemma3"},
            ),
        ),
        (
            "gemma3-mm",
            Tiny(
                "Gemma3Config",
                extra={"sliding_window": 16, "final_logit_softcapping": 30.0, "layer_types": "gemma3"},
                multimodal=True,
            ),
        ),
        ("gemma2", Tiny("Gemma2Config", extra={"sliding_window": 16, "final_logit_softcapping": 30.0})),
        ("phi3", Tiny("Phi3Config", extra={"partial_rotary_factor": 0.5})),
        ("olmo2", Tiny("Olmo2Config")),
        ("granite", Tiny("GraniteConfig", extra={"logits_scaling": 8.0, "embedding_multiplier": 2.0})),
        ("smollm3", Tiny("SmolLM3Config", extra={"no_rope_layer_interval": 2})),
        ("mixtral", Tiny("MixtralConfig", kind="moe", extra={"num_local_experts": 4, **_MOE})),
        (
            "qwen3-moe",
            Tiny("Qwen3MoeConfig", kind="moe", extra={"num_experts": 4, "moe_intermediate_size": 32, **_MOE}),
        ),
        ("olmoe", Tiny("OlmoeConfig", kind="moe", extra={"num_experts": 4, **_MOE})),
        ("gpt-oss", Tiny("GptOssConfig", kind="moe", extra={"num_local_experts": 4, "sliding_window": 16, **_MOE})),
        ("cohere", Tiny("CohereConfig", extra={"logit_scale": 0.5})),
        ("mamba", Tiny("MambaConfig", kind="ssm", extra={"state_size": 8})),
        ("gpt2", Tiny("GPT2Config", extra={"n_layer": 4, "n_embd": 64, "n_head": 4, "n_inner": 128})),
        (
            "qwen2-moe",
            Tiny(
                "Qwen2MoeConfig",
                kind="moe",
                extra={"num_experts": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, **_MOE},
            ),
        ),
        ("stablelm", Tiny("StableLmConfig", extra={"partial_rotary_factor": 0.25})),
        (
            "jamba",
            Tiny(
                "JambaConfig",
                kind="hybrid",
                extra={"num_experts": 2, "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 8},
            ),
        ),
        (
            "mamba2",
            Tiny("Mamba2Config", kind="ssm", extra={"num_heads": 4, "head_dim": 32, "state_size": 8, "n_groups": 1}),
        ),
        (
            "llama4",
            Tiny("Llama4TextConfig", kind="moe", extra={"num_local_experts": 2, "intermediate_size_mlp": 128, **_MOE}),
        ),
        ("falcon-h1", Tiny("FalconH1Config", kind="hybrid", extra={"mamba_d_state": 8, "mamba_n_heads": 8})),
    )
}
