"""A tiny random Llama as a real GGUF file (written with the gguf package's own writer), so that the
GGUF loader and its conversion cache run in fast tests: 2 layers, hidden 64, a byte-level BPE
vocabulary of 261 tokens, float32 tensors (about 0.4 MB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def write_tiny_gguf(path: Path, *, layers: int = 2, hidden: int = 64, ff: int = 128, seed: int = 0) -> Path:
    import gguf

    heads, kv_heads = 4, 2
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *_byte_tokens(), "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-gguf")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    w.add_token_merges(["h e"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head = hidden // heads
    w.add_tensor("token_embd.weight", rand(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", rand(len(tokens), hidden))
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(kv_heads * head, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(kv_heads * head, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", rand(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(ff, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(ff, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", rand(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
