"""Seeded tiny random models built from a config, with an offline byte-level tokenizer.

They exercise every code path of a family in seconds without a download. Their
weights are random, so their numbers mean nothing; their mechanics mean everything.
"""

from __future__ import annotations

import torch

from sweep.config import ModelConfig
from sweep.families import FAMILIES

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


def build_tiny(mcfg: ModelConfig, seed: int, vocab_size: int):
    """A random model of ``mcfg.family`` with ``mcfg.tiny`` sizes, initialised from ``seed``."""
    import transformers
    from transformers import AutoModelForCausalLM

    assert mcfg.family is not None and mcfg.tiny is not None
    t = mcfg.tiny
    fam = FAMILIES[mcfg.family]
    kwargs = dict(
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
    if fam.name == "mistral":
        kwargs["sliding_window"] = 64  # shorter than a long prompt: the sliding cache is exercised
    if fam.name == "gemma3":
        kwargs.update(
            sliding_window=16,
            query_pre_attn_scalar=t.head_dim,
            final_logit_softcapping=30.0,  # exercises the adapter's softcap in the logit lens
            layer_types=["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(t.layers)],
        )
    config = getattr(transformers, fam.config_class)(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    randomise_norms_and_biases(model, seed, fam.norm_offset, t.init_std)
    return model


@torch.no_grad()
def randomise_norms_and_biases(model: torch.nn.Module, seed: int, norm_offset: float, bias_std: float) -> None:
    """Give every norm a random scale in [0.5, 1.5) and every bias N(0, bias_std), from ``seed``.

    HF initialises norm scales to exactly 1 and biases to 0, which would let code that drops
    a norm scale (the layers' input norms, Qwen3's and Gemma3's K norm, the final norm) or a
    bias (Qwen2's K/V bias) pass every check on a tiny model. ``norm_offset`` is the family's
    (Gemma stores scale - 1).
    """
    gen = torch.Generator().manual_seed(0x5EED_0000 + seed)
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
            w = module.weight
            scale = 0.5 + torch.rand(w.shape, generator=gen, dtype=torch.float32)
            w.copy_((scale - norm_offset).to(w.dtype))
        for pname, p in module.named_parameters(recurse=False):
            if pname == "bias":
                p.copy_((bias_std * torch.randn(p.shape, generator=gen, dtype=torch.float32)).to(p.dtype))
