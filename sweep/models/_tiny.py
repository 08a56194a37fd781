"""Seeded tiny random models built from a config, with an offline byte-level tokenizer.

They exercise every code path of a family in seconds without a download. Their
weights are random, so their numbers mean nothing; their mechanics mean everything.
What each family sets beyond the common sizes is data (``sweep.config.families.TINY``).
"""

from __future__ import annotations

import inspect

import torch

from sweep.config import ModelConfig
from sweep.config.families import TINY

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens plus chat specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[1])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(mcfg: ModelConfig, vocab_size: int):
    """The transformers config of ``mcfg``'s tiny model: the common sizes, then what the family sets."""
    import transformers

    assert mcfg.family is not None and mcfg.tiny is not None
    t, spec = mcfg.tiny, TINY[mcfg.family]
    values = dict(
        vocab_size=vocab_size,
        hidden_size=t.hidden,
        num_hidden_layers=t.layers,
        num_attention_heads=t.heads,
        num_key_value_heads=t.kv_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate,
        max_position_embeddings=4096,
        initializer_range=t.init_std,
        tie_word_embeddings=True,
        bos_token_id=vocab_size - len(SPECIAL_TOKENS),
        eos_token_id=vocab_size - len(SPECIAL_TOKENS) + 1,
        pad_token_id=None,
    )
    for key, value in spec.extra.items():
        if key == "layer_types" and value == "gemma3":  # every third layer global, the others sliding (Gemma 3)
            value = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(t.layers)]
        values[key] = value
    if "query_pre_attn_scalar" in _parameters(spec.config_class) and spec.config_class.startswith("Gemma"):
        values["query_pre_attn_scalar"] = t.head_dim
    config_class = getattr(transformers, spec.config_class)
    if not spec.multimodal:
        return config_class(**values)
    # a vision-language wrapper: the decoder is its text model, the vision tower is as small as it gets
    text_class = getattr(transformers, spec.config_class.replace("Config", "TextConfig"))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16)
    vision["patch_size"] = 8
    top = {k: values.pop(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")}
    return config_class(text_config=text_class(**values).to_dict(), vision_config=vision, mm_tokens_per_image=4, **top)


def _parameters(config_class: str) -> set[str]:
    import transformers

    return set(inspect.signature(getattr(transformers, config_class).__init__).parameters)


def build_tiny(mcfg: ModelConfig, seed: int, vocab_size: int):
    """A random model of ``mcfg.family`` with ``mcfg.tiny`` sizes, initialised from ``seed``."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(mcfg, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    randomise_norms_and_biases(model, seed, mcfg.tiny.init_std)
    return model


def _is_norm(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm")) or isinstance(module, torch.nn.LayerNorm)


@torch.no_grad()
def randomise_norms_and_biases(model: torch.nn.Module, seed: int, bias_std: float) -> None:
    """Give every norm a random scale in [0.5, 1.5) and every bias N(0, bias_std), from ``seed``.

    HF initialises norm scales to exactly 1 and biases to 0, which would let code that drops
    a norm scale (the layers' input norms, a K norm, the final norm) or a bias (Qwen2's K/V
    bias, a LayerNorm's shift) pass every check on a tiny model. A norm HF initialises to 0
    scales by (1 + weight) (Gemma's): it gets the same random scale, stored as scale - 1.
    """
    gen = torch.Generator().manual_seed(0x5EED_0000 + seed)
    for _name, module in model.named_modules():
        if _is_norm(module) and getattr(module, "weight", None) is not None:
            w = module.weight
            offset = 1.0 if bool((w == 0).all()) else 0.0
            scale = 0.5 + torch.rand(w.shape, generator=gen, dtype=torch.float32)
            w.copy_((scale - offset).to(w.dtype))
        for pname, p in module.named_parameters(recurse=False):
            if pname == "bias":
                p.copy_((bias_std * torch.randn(p.shape, generator=gen, dtype=torch.float32)).to(p.dtype))
