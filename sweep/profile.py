"""Per-layer profile of full-depth decoding: the trace, the layer curve, EAS, oracle exit.

``trace_prompt`` turns one prompt and its greedy continuation into per-(position,
layer) signals from one teacher-forced forward pass; the summaries are polars
expressions over the trace table, so they work on any number of stored runs.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from sweep.models import LoadedModel
from sweep.prompts import Prompt

log = logging.getLogger("sweep.profile")

S_VARIANTS = {"hidden": "cos_hidden", "logits": "cos_logits", "topk": "topk_overlap"}


@torch.inference_mode()
def trace_prompt(lm: LoadedModel, prompt: Prompt, generated: Sequence[int], topk: int) -> dict[str, np.ndarray]:
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
    per_layer = []
    for layer in range(1, L + 1):
        h, h_prev = hs[layer][0], hs[layer - 1][0]
        normed = adapter.norm(h)
        z = adapter.head(normed).float()
        top = z.topk(k, dim=-1)
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
    )
    cols["top1_match"] = cols["top1"] == cols["top1_final"]
    return cols


def profile_prompts(lm: LoadedModel, prompts: Sequence[Prompt], gen_tokens: int, topk: int) -> pl.DataFrame:
    """Greedy full-depth decoding, then the per-layer trace, for each prompt in order."""
    from sweep.engine import greedy_decode

    frames = []
    for i, prompt in enumerate(prompts, start=1):
        t0 = time.perf_counter()
        generated = greedy_decode(lm, prompt.input_ids, gen_tokens)
        t1 = time.perf_counter()
        frames.append(pl.DataFrame(trace_prompt(lm, prompt, generated, topk)))
        log.info(
            "[%d/%d] %s: %d prompt + %d generated tokens; decode %.2f s, trace %.2f s",
            i, len(prompts), prompt.id, len(prompt.input_ids), gen_tokens, t1 - t0, time.perf_counter() - t1,
        )
    return pl.concat(frames, how="vertical")


def layer_curve(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per model and layer: median delta, logit-lens top-1 agreement, median margin."""
    return (
        trace.lazy()
        .group_by("model", "layer")
        .agg(
            delta_median=pl.col("delta").median(),
            top1_agreement=pl.col("top1_match").mean(),
            margin_median=pl.col("margin").median(),
            positions=pl.len(),
        )
        .sort("model", "layer")
        .collect()
    )


def eas_table(trace: pl.DataFrame | pl.LazyFrame, alpha: float) -> pl.DataFrame:
    """EAS per model for each similarity variant (arXiv 2603.23701).

    S_l is the mean similarity over all traced positions, clipped to [0, 1];
    w_l = (L - l) / L; A_l = S_l^alpha * w_l^(1 - alpha); EAS = mean of A_l, l = 1..L-1.
    """
    per_layer = eas_per_layer(trace, alpha)
    return (
        per_layer.lazy()
        .filter(pl.col("layer") < pl.col("num_layers"))
        .group_by("model", "variant")
        .agg(eas=pl.col("a").mean(), layers=pl.len())
        .with_columns(alpha=pl.lit(alpha), topk=pl.lit(_single_topk(trace)))
        .sort("model", "variant")
        .collect()
    )


def eas_per_layer(trace: pl.DataFrame | pl.LazyFrame, alpha: float) -> pl.DataFrame:
    """S_l, w_l and A_l per model, variant and layer (the curve EAS averages)."""
    means = (
        trace.lazy()
        .group_by("model", "layer")
        .agg(pl.col("num_layers").first(), *[pl.col(c).mean().alias(v) for v, c in S_VARIANTS.items()])
        .unpivot(index=["model", "layer", "num_layers"], on=list(S_VARIANTS), variable_name="variant", value_name="s")
    )
    w = (pl.col("num_layers") - pl.col("layer")) / pl.col("num_layers")
    s = pl.col("s").clip(0.0, 1.0)
    return (
        means.with_columns(w=w, a=s.pow(alpha) * w.pow(1.0 - alpha), s=s)
        .sort("model", "variant", "layer")
        .collect()
    )


def oracle_exits(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per traced position: the earliest layer whose top-1 equals the final top-1 and stays equal."""
    last_miss = pl.when(~pl.col("top1_match")).then(pl.col("layer")).otherwise(0).max()
    return (
        trace.lazy()
        .group_by("model", "run_id", "prompt_id", "position")
        .agg(pl.col("phase").first(), pl.col("num_layers").first(), oracle_exit=last_miss + 1)
        .sort("model", "run_id", "prompt_id", "position")
        .collect()
    )


def oracle_summary(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Mean oracle exit layer and the fraction of positions that could exit before L."""
    exits = oracle_exits(trace)
    both = pl.concat([exits.with_columns(phase=pl.lit("all")), exits])
    return (
        both.lazy()
        .group_by("model", "phase")
        .agg(
            mean_oracle_exit=pl.col("oracle_exit").mean(),
            frac_before_L=(pl.col("oracle_exit") < pl.col("num_layers")).mean(),
            positions=pl.len(),
            num_layers=pl.col("num_layers").first(),
        )
        .sort("model", "phase")
        .collect()
    )


def _single_topk(trace: pl.DataFrame | pl.LazyFrame) -> int | None:
    ks = trace.lazy().select(pl.col("topk").unique()).collect()["topk"].to_list()
    return ks[0] if len(ks) == 1 else None


def format_summary(trace: pl.DataFrame, alpha: float) -> str:
    """The text `sweep profile` prints: layer curve, EAS (variants, alpha, K), oracle exits."""
    lines = []
    for model in sorted(trace["model"].unique().to_list()):
        sub = trace.filter(pl.col("model") == model)
        curve = layer_curve(sub)
        L = int(sub["num_layers"][0])
        lines.append(f"model {model}: L={L}, {sub.select(pl.struct('run_id', 'prompt_id', 'position').n_unique()).item()} positions")
        lines.append(f"{'layer':>5}  {'delta (median)':>14}  {'top-1 agree':>11}  {'margin (median)':>15}")
        for row in curve.iter_rows(named=True):
            lines.append(f"{row['layer']:>5}  {row['delta_median']:>14.4f}  {row['top1_agreement']:>11.3f}  {row['margin_median']:>15.3f}")
        eas = {r["variant"]: r["eas"] for r in eas_table(sub, alpha).iter_rows(named=True)}
        k = _single_topk(sub)
        lines.append(
            f"EAS (alpha={alpha:g}, K={k}, S averaged over all positions, A_l over l=1..{L - 1}): "
            f"hidden-cosine {eas['hidden']:.4f}  logit-cosine {eas['logits']:.4f}  top-{k} overlap {eas['topk']:.4f}"
        )
        for r in oracle_summary(sub).iter_rows(named=True):
            lines.append(
                f"oracle exit ({r['phase']} positions, n={r['positions']}): mean layer {r['mean_oracle_exit']:.2f} of {L}; "
                f"{100 * r['frac_before_L']:.1f}% could exit before layer {L}"
            )
    return "\n".join(lines)


def run_profile(cfg) -> tuple[str, pl.DataFrame]:
    """`sweep profile`: load, read prompts, trace each, write one Parquet table; returns (path, trace)."""
    from sweep.models import load_model
    from sweep.prompts import read_prompts, tokenize_prompts
    from sweep.run_info import provenance, new_run_id
    from sweep.store import write_table

    items = read_prompts(cfg.prompts)  # a bad prompts file fails before the model loads
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    room = getattr(lm.model.config, "max_position_embeddings", None)
    prompts = tokenize_prompts(items, cfg.prompts, lm.tokenizer, room=None if room is None else room - cfg.profile.gen_tokens)
    t0 = time.perf_counter()
    trace = profile_prompts(lm, prompts, cfg.profile.gen_tokens, cfg.profile.topk)
    run_id = cfg.run_id or new_run_id()
    prov = provenance(cfg, lm, run_id)
    trace = trace.with_columns(prompt_set=pl.lit(cfg.prompts.name), **{k: pl.lit(v) for k, v in prov.items() if k in ("model", "num_layers", "run_id")})
    path = write_table("profile", trace, root=cfg.results.root, provenance=prov, stem=run_id)
    log.info("profiled %d prompts in %.1f s; wrote %d rows to %s", len(prompts), time.perf_counter() - t0, trace.height, path)
    return str(path), trace
