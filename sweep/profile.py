"""Per-layer profile of full-depth decoding: the trace table `sweep profile` writes.

``trace_prompt`` turns one prompt and its greedy continuation into per-(position,
layer) signals from one teacher-forced forward pass; the summaries of a trace (layer
curve, EAS, oracle exit) are polars functions in ``sweep.analysis``.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from sweep.gates import cosine_prev, pca_basis, pca_delta
from sweep.models import LoadedModel
from sweep.prompts import Prompt

log = logging.getLogger("sweep.profile")

@torch.inference_mode()
def trace_prompt(lm: LoadedModel, prompt: Prompt, generated: Sequence[int], topk: int, pca_k: int = 64) -> dict[str, np.ndarray]:
    """Signals at every position of prompt + generated[:-1] and every layer 1..L.

    Position p's hidden states predict the token at p + 1, so the last generated token
    is not fed. Rows are ordered by position, then layer.
    """
    adapter = lm.adapter
    ids = list(prompt.input_ids) + list(generated[:-1])
    x = torch.tensor([ids], device=lm.device)
    with adapter.capture_hidden() as hs:
        lm.model(input_ids=x, use_cache=False, logits_to_keep=1)
    L = adapter.num_layers
    assert len(hs) == L + 1, f"captured {len(hs)} hidden states for {L} layers"
    n_final = adapter.norm(hs[L][0])
    z_final = adapter.head(n_final).float()
    k = max(topk, 2)
    top_final = z_final.topk(topk, dim=-1).indices
    centered_final = z_final - z_final.mean(dim=-1, keepdim=True)
    basis = pca_basis(adapter.lm_head.weight, min(pca_k, adapter.lm_head.weight.shape[1]))
    per_layer = []
    for layer in range(1, L + 1):
        h, h_prev = hs[layer][0], hs[layer - 1][0]
        normed = adapter.norm(h)
        z = adapter.head(normed).float()
        top = z.topk(k, dim=-1)
        logp = torch.log_softmax(z, dim=-1)
        top_p = logp.topk(2, dim=-1).values.exp()
        per_layer.append(
            {
                "delta": ((h - h_prev).float().norm(dim=-1) / h.float().norm(dim=-1)),
                "margin": top.values[:, 0] - top.values[:, 1],
                "top1": z.argmax(dim=-1),  # argmax, like top1_final, so ties break the same way
                "residual_inf": (z - z_final).abs().amax(dim=-1),
                "cos_hidden": F.cosine_similarity(normed.float(), n_final.float(), dim=-1),
                # softmax ignores a constant shift of the logits, so compare them centred
                "cos_logits": F.cosine_similarity(z - z.mean(dim=-1, keepdim=True), centered_final, dim=-1),
                "topk_overlap": (top.indices[:, :topk, None] == top_final[:, None, :]).any(-1).sum(-1).float() / topk,
                "prob_margin": top_p[:, 0] - top_p[:, 1],
                "entropy": -(logp.exp() * logp).sum(dim=-1),
                "cos_prev": cosine_prev(h, h_prev),
                "pca_delta": pca_delta(normed, adapter.norm(h_prev), basis),
            }
        )
    T = len(ids)
    cols = {k: torch.stack([d[k] for d in per_layer], dim=1).reshape(-1).cpu().numpy() for k in per_layer[0]}
    top1_final = z_final.argmax(-1).cpu().numpy()
    positions = np.arange(T, dtype=np.int32)
    n_prompt = len(prompt.input_ids)
    cols.update(
        prompt_id=np.full(T * L, prompt.id, dtype=object),
        position=np.repeat(positions, L),
        phase=np.repeat(np.where(positions < n_prompt, "prefill", "decode"), L),
        layer=np.tile(np.arange(1, L + 1, dtype=np.int32), T),
        token_id=np.repeat(np.asarray(ids, dtype=np.int64), L),
        top1_final=np.repeat(top1_final, L),
        topk=np.full(T * L, topk, dtype=np.int32),
        pca_k=np.full(T * L, basis.shape[0], dtype=np.int32),
    )
    cols["top1_match"] = cols["top1"] == cols["top1_final"]
    return cols


def profile_prompts(lm: LoadedModel, prompts: Sequence[Prompt], gen_tokens: int, topk: int, pca_k: int = 64) -> pl.DataFrame:
    """Greedy full-depth decoding, then the per-layer trace, for each prompt in order."""
    from sweep.engine import greedy_decode

    frames = []
    for i, prompt in enumerate(prompts, start=1):
        t0 = time.perf_counter()
        generated = greedy_decode(lm, prompt.input_ids, gen_tokens)
        t1 = time.perf_counter()
        frames.append(pl.DataFrame(trace_prompt(lm, prompt, generated, topk, pca_k)))
        log.info(
            "[%d/%d] %s: %d prompt + %d generated tokens; decode %.2f s, trace %.2f s",
            i, len(prompts), prompt.id, len(prompt.input_ids), gen_tokens, t1 - t0, time.perf_counter() - t1,
        )
    return pl.concat(frames, how="vertical")


def traced_run(cfg, lm: LoadedModel, prompts: Sequence[Prompt], run_id: str, gen_tokens: int) -> tuple[pl.DataFrame, dict]:
    """The trace table of ``prompts`` (every column but the shared provenance) and that provenance."""
    from sweep.run_info import provenance

    trace = profile_prompts(lm, prompts, gen_tokens, cfg.profile.topk, cfg.profile.pca_k)
    prov = provenance(cfg, lm, run_id)
    trace = trace.with_columns(prompt_set=pl.lit(cfg.prompts.name), **{k: pl.lit(v) for k, v in prov.items() if k in ("model", "num_layers", "run_id")})
    return trace, prov


def run_profile(cfg) -> tuple[str, pl.DataFrame]:
    """`sweep profile`: load, read prompts, trace each, write one Parquet table; returns (path, trace)."""
    from sweep.models import load_model
    from sweep.prompts import read_prompts, tokenize_prompts
    from sweep.run_info import new_run_id
    from sweep.store import write_table

    items = read_prompts(cfg.prompts)  # a bad prompts file fails before the model loads
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    room = getattr(lm.model.config, "max_position_embeddings", None)
    prompts = tokenize_prompts(items, cfg.prompts, lm.tokenizer, room=None if room is None else room - cfg.profile.gen_tokens)
    t0 = time.perf_counter()
    run_id = cfg.run_id or new_run_id()
    trace, prov = traced_run(cfg, lm, prompts, run_id, cfg.profile.gen_tokens)
    path = write_table("profile", trace, root=cfg.results.root, provenance=prov, stem=run_id)
    log.info("profiled %d prompts in %.1f s; wrote %d rows to %s", len(prompts), time.perf_counter() - t0, trace.height, path)
    return str(path), trace
