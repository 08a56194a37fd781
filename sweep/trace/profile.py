"""Per-layer profile of full-depth decoding: the trace table `sweep profile` writes.

``trace_prompt`` turns one prompt and its greedy continuation into per-(position,
layer) signals; the summaries of a trace (layer curve, EAS, oracle exit) are polars
functions in ``sweep.analysis``. The hidden states are captured while decoding the way the
engine decodes (prefill, then one token per step through the KV cache), not by one forward
over the whole sequence: in bf16/fp16 the two differ by a rounding step that moves signals
across thresholds, and the trace must hold the states the engine's gates see.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from sweep import progress
from sweep.gates.signals import (
    cosine_prev,
    entropy,
    lens_residual,
    lm_head_basis,
    logit_margin,
    pca_delta,
    prob_margin,
    saturation_delta,
)
from sweep.decode.states import DecodedStates, decode_states
from sweep.models import LoadedModel
from sweep.models.prompts import Prompt

log = logging.getLogger("sweep.trace.profile")


def gate_signals(
    adapter,
    h: torch.Tensor,
    h_prev: torch.Tensor,
    basis: torch.Tensor,
    *,
    normed: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Every gate's signal for rows h = h_l, h_prev = h_{l-1} (B, hidden), computed as the gates'
    ``decide`` computes it (the same functions on the same shapes; the lens as the engine's probe).
    ``normed`` (final_norm(h)) and ``z`` (its logits) when the caller already has them."""
    normed = adapter.norm(h) if normed is None else normed
    z = adapter.head(normed) if z is None else z
    return {
        "delta": saturation_delta(h, h_prev),
        "margin": logit_margin(z),
        "top1": z.argmax(dim=-1),  # the token an exit here emits
        "prob_margin": prob_margin(z),
        "entropy": entropy(z),
        "cos_prev": cosine_prev(h, h_prev),
        "pca_delta": pca_delta(normed, adapter.norm(h_prev), basis),
    }


@torch.inference_mode()
def trace_prompt(
    lm: LoadedModel,
    prompt: Prompt,
    generated: Sequence[int],
    topk: int,
    pca_k: int = 64,
    *,
    decoded: DecodedStates | None = None,
    readouts=None,
) -> dict[str, np.ndarray]:
    """Signals at every position of prompt + generated[:-1] and every layer 1..L.

    Position p's hidden states predict the token at p + 1, so the last generated token
    is not fed. Rows are ordered by position, then layer. The states are ``decode_states``'
    (computed here unless given): the ones the engine decides on. Every gate signal comes from
    its one definition in ``sweep.gates``, computed the way the engine computes it: at the
    positions where a gate decides (the last prefill position and the decode positions) one
    row at a time, like ``decide``; the prefill's lens residual over the prompt block, like the
    conformal gate's calibration. A replay of this trace decides as the engine does, in any dtype.
    With ``readouts`` (``sweep.trace.readouts.Readouts``) the tuned lens's signals and the exit classifiers'
    probabilities are traced the same way (``tuned_*``, ``classifier_prob``, ``tuned_classifier_prob``).
    """
    adapter = lm.adapter
    ids = list(prompt.input_ids) + list(generated[:-1])
    if decoded is None:
        decoded = decode_states(lm, prompt.input_ids, generated=generated)
    hs = decoded.states
    L, T, P = adapter.num_layers, len(ids), len(prompt.input_ids)
    assert len(hs) == L + 1 and hs[0].shape[1] == T, f"states for {hs[0].shape[1]} positions, {T} fed"

    def blocks(fn, layer):  # the prompt block (as the prefill computes it), then the decode block
        return torch.cat([fn(hs[layer][:, :P]), fn(hs[layer][:, P:])], dim=1)[0]

    n_final = blocks(adapter.norm, L)
    z_final = adapter.head(n_final)
    k = max(topk, 2)
    z_final32 = z_final.float()
    top_final = z_final32.topk(topk, dim=-1).indices
    centered_final = z_final32 - z_final32.mean(dim=-1, keepdim=True)
    logp_final = torch.log_softmax(z_final32, dim=-1)
    basis = lm_head_basis(adapter, min(pca_k, adapter.lm_head.weight.shape[1]))
    decide_at = torch.arange(P - 1, T, device=hs[0].device)  # where gates decide: the first token's, then each step's
    per_layer = []
    for layer in range(1, L + 1):
        h, h_prev = hs[layer][0], hs[layer - 1][0]
        normed = blocks(adapter.norm, layer)
        z_raw = adapter.head(normed)
        z = z_raw.float()
        top = z.topk(k, dim=-1)
        col = {
            **gate_signals(adapter, h, h_prev, basis, normed=normed, z=z_raw),
            "residual_inf": lens_residual(z_raw, z_final),
            "cos_hidden": F.cosine_similarity(normed.float(), n_final.float(), dim=-1),
            # softmax ignores a constant shift of the logits, so compare them centred
            "cos_logits": F.cosine_similarity(z - z.mean(dim=-1, keepdim=True), centered_final, dim=-1),
            "topk_overlap": (top.indices[:, :topk, None] == top_final[:, None, :]).any(-1).sum(-1).float() / topk,
            "kl_final": _kl(logp_final, z),
        }
        for pos in decide_at.tolist():  # what the engine's decide() sees there, row by row
            for name, value in gate_signals(adapter, h[pos : pos + 1], h_prev[pos : pos + 1], basis).items():
                col[name][pos] = value[0].to(col[name].dtype)
        if readouts is not None:
            col.update(_readout_signals(adapter, readouts, layer, hs, P, decide_at, z_final, logp_final))
        per_layer.append(col)
    cols = {k: torch.stack([d[k] for d in per_layer], dim=1).reshape(-1).cpu().numpy() for k in per_layer[0]}
    top1_final = z_final32.argmax(-1).cpu()
    top1_final[P - 1 :] = torch.tensor(decoded.greedy[: T - P + 1])  # the model's own full-depth token at each step
    top1_final = top1_final.numpy()
    positions = np.arange(T, dtype=np.int32)
    cols.update(
        prompt_id=np.full(T * L, prompt.id, dtype=object),
        position=np.repeat(positions, L),
        phase=np.repeat(np.where(positions < P, "prefill", "decode"), L),
        layer=np.tile(np.arange(1, L + 1, dtype=np.int32), T),
        token_id=np.repeat(np.asarray(ids, dtype=np.int64), L),
        top1_final=np.repeat(top1_final, L),
        topk=np.full(T * L, topk, dtype=np.int32),
        pca_k=np.full(T * L, basis.shape[0], dtype=np.int32),
    )
    cols["top1_match"] = cols["top1"] == cols["top1_final"]
    if readouts is not None:
        cols["tuned_match"] = cols["tuned_top1"] == cols["top1_final"]
        cols["readouts_id"] = np.full(T * L, readouts.digest[:16], dtype=object)
    return cols


def _kl(logp_final: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """KL(softmax(z_L) || softmax(z)) per row, in nats (float32)."""
    return (logp_final.exp() * (logp_final - torch.log_softmax(z.float(), dim=-1))).sum(-1)


def _readout_signals(adapter, readouts, layer: int, hs, P: int, decide_at, z_final, logp_final) -> dict:
    """The tuned lens's signals at ``layer`` over every position (the prompt block as a calibration
    reads it, then the decode block), and at the decision positions row by row as a gate's probe
    computes them; the exit classifiers' probabilities (logit and tuned lens) likewise."""
    h, h_prev = hs[layer][0], hs[layer - 1][0]

    def tuned(x):
        return readouts.lens(adapter, layer, x, "tuned")

    t_raw = torch.cat([tuned(hs[layer][:, :P]), tuned(hs[layer][:, P:])], dim=1)[0]
    col = {
        **_lens_columns(t_raw),
        "tuned_residual_inf": lens_residual(t_raw, z_final),
        "tuned_kl_final": _kl(logp_final, t_raw),
        "classifier_prob": readouts.classifier_prob(layer, h, h_prev, "logit").float(),
        "tuned_classifier_prob": readouts.classifier_prob(layer, h, h_prev, "tuned").float(),
    }
    for pos in decide_at.tolist():
        one, prev = h[pos : pos + 1], h_prev[pos : pos + 1]
        for name, value in _lens_columns(tuned(one)).items():
            col[name][pos] = value[0].to(col[name].dtype)
        for lens in ("logit", "tuned"):
            name = "classifier_prob" if lens == "logit" else "tuned_classifier_prob"
            col[name][pos] = readouts.classifier_prob(layer, one, prev, lens)[0].float()
    return col


def _lens_columns(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """A tuned lens's signals, computed as the lens-probe gates compute them from its logits."""
    return {
        "tuned_top1": t.argmax(dim=-1),
        "tuned_margin": logit_margin(t),
        "tuned_prob_margin": prob_margin(t),
        "tuned_entropy": entropy(t),
    }


def profile_prompts(
    lm: LoadedModel, prompts: Sequence[Prompt], gen_tokens: int, topk: int, pca_k: int = 64, readouts=None
) -> pl.DataFrame:
    """Greedy full-depth decoding with every layer's states captured, then the per-layer trace,
    for each prompt in order (refused where the logit lens is not the model's own: its signals read it)."""
    lm.require(lens=True)
    frames = []
    shown = progress.start("profile", len(prompts), part="profile")  # one step per prompt
    for prompt in prompts:
        t0 = time.perf_counter()
        decoded = decode_states(lm, prompt.input_ids, n_tokens=gen_tokens)
        t1 = time.perf_counter()
        cols = trace_prompt(lm, prompt, decoded.tokens, topk, pca_k, decoded=decoded, readouts=readouts)
        frames.append(pl.DataFrame(cols))
        del decoded
        shown.advance(
            text=f"{prompt.id}: {len(prompt.input_ids)} prompt + {gen_tokens} generated tokens; decode "
            f"{t1 - t0:.2f} s, trace {time.perf_counter() - t1:.2f} s"
        )
    shown.close()
    trace = pl.concat(frames, how="vertical")
    from sweep.store import TABLES

    absent = [c for c in TABLES["profile"].columns if c.name in READOUT_COLUMNS and c.name not in trace.columns]
    return trace.with_columns(pl.lit(None, dtype=c.dtype).alias(c.name) for c in absent)  # no readouts: null


# the trace's columns that come from `sweep fit`'s readouts (profile.readouts); null without them
READOUT_COLUMNS = (
    "readouts_id",
    "tuned_top1",
    "tuned_match",
    "tuned_margin",
    "tuned_prob_margin",
    "tuned_entropy",
    "tuned_residual_inf",
    "tuned_kl_final",
    "classifier_prob",
    "tuned_classifier_prob",
)


def traced_run(
    cfg, lm: LoadedModel, prompts: Sequence[Prompt], run_id: str, gen_tokens: int, readouts_cache=None
) -> tuple[pl.DataFrame, dict]:
    """The trace table of ``prompts`` (every column but the shared provenance) and that provenance;
    with ``profile.readouts`` the tuned lens's and exit classifiers' columns too (the readouts
    checked against the model and disjoint from the prompts; from ``readouts_cache`` when it holds them)."""
    from sweep.errors import ConfigError
    from sweep.store.run_info import provenance

    vocab = lm.adapter.lm_head.weight.shape[0]
    if cfg.profile.topk > vocab:  # before any decoding: the trace's top-K needs that many tokens
        raise ConfigError(f"profile.topk={cfg.profile.topk}: at most {vocab}, the vocabulary size of model={lm.name}")
    readouts = None
    if cfg.profile.readouts is not None:
        from sweep.gates.readouts import readouts_for

        readouts = readouts_for(cfg.profile.readouts, lm, prompts, key="profile.readouts", cache=readouts_cache)
    trace = profile_prompts(lm, prompts, gen_tokens, cfg.profile.topk, cfg.profile.pca_k, readouts)
    prov = provenance(cfg, lm, run_id)
    trace = trace.with_columns(
        prompt_set=pl.lit(cfg.prompts.name),
        **{k: pl.lit(v) for k, v in prov.items() if k in ("model", "num_layers", "run_id")},
    )
    return trace, prov


def prepare(cfg, session) -> tuple[LoadedModel, list[Prompt], Any]:
    """`sweep profile`'s model and prompts from ``session`` (``sweep.bench.session``), and the readouts
    profile.readouts names, checked here (its file before the model loads; against the model, disjoint from the
    prompts, after) before any work."""
    if cfg.profile.readouts is not None:
        from sweep.gates.readouts import check_readouts_file
        from sweep.models import shape_before_load

        shape = shape_before_load(cfg.model)  # its depth and width too, where they can be read before the load
        check_readouts_file(cfg.profile.readouts, "profile.readouts", shape)
    lm, prompts = session.workload(cfg, ("profile.gen_tokens", cfg.profile.gen_tokens))
    if cfg.profile.readouts is not None:
        session.readouts_for(cfg.profile.readouts, lm, prompts, "profile.readouts")
    return lm, prompts, session.readouts


def trace(cfg, prepared) -> tuple[pl.DataFrame, dict, float]:
    """Trace every prompt: (the trace, its provenance, seconds)."""
    from sweep.store.run_info import new_run_id

    lm, prompts, readouts = prepared
    t0 = time.perf_counter()
    table, prov = traced_run(cfg, lm, prompts, cfg.run_id or new_run_id(), cfg.profile.gen_tokens, readouts)
    return table, prov, time.perf_counter() - t0


def write(cfg, prepared, result) -> str:
    """One Parquet table under results.root; its path."""
    from sweep.store import write_table

    table, prov, seconds = result
    path = write_table("profile", table, root=cfg.results.root, provenance=prov, stem=prov["run_id"])
    log.info("profiled %d prompts in %.1f s; wrote %d rows to %s", len(prepared[1]), seconds, table.height, path)
    return str(path)


def render(cfg, prepared, result, path: str) -> tuple[list[str], int]:
    """The lens summary (per layer: top-1 agreement, KL, EAS) and the trace's path."""
    from sweep.analysis import format_summary
    from sweep.textfit import fit_lines

    return [fit_lines(format_summary(result[0], cfg.eas.alpha)), f"trace: {path}"], 0


def run_profile(cfg, session=None) -> tuple[str, pl.DataFrame]:
    """`sweep profile` as a library call (``sweep.cli.verbs``' four steps, in ``session``, default this
    process's): returns (path, trace)."""
    from sweep.bench.session import process_session

    prepared = prepare(cfg, process_session() if session is None else session)
    result = trace(cfg, prepared)
    return write(cfg, prepared, result), result[0]
