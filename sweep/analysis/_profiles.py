"""Summaries of profile traces: the layer curve, EAS (arXiv 2603.23701), oracle exits, and the
learned readouts' curves (tuned lens against logit lens).

Polars over the trace table, so they work on one run or on every stored run.
"""

from __future__ import annotations

import polars as pl

S_VARIANTS = {"hidden": "cos_hidden", "logits": "cos_logits", "topk": "topk_overlap"}


def layer_curve(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per model and layer: median delta (and the pca probe's pca_delta beside it), logit-lens
    top-1 agreement, median margin; the 10th and 90th percentiles of delta and margin beside their medians
    (a threshold under the median still fires on the steps below it)."""
    return (
        trace.lazy()
        .group_by("model", "layer")
        .agg(
            delta_median=pl.col("delta").median(),
            delta_q10=pl.col("delta").quantile(0.1, "linear"),
            delta_q90=pl.col("delta").quantile(0.9, "linear"),
            pca_delta_median=pl.col("pca_delta").median(),
            top1_agreement=pl.col("top1_match").mean(),
            margin_median=pl.col("margin").median(),
            margin_q10=pl.col("margin").quantile(0.1, "linear"),
            margin_q90=pl.col("margin").quantile(0.9, "linear"),
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
    return means.with_columns(w=w, a=s.pow(alpha) * w.pow(1.0 - alpha), s=s).sort("model", "variant", "layer").collect()


def oracle_exits(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per traced position, the two oracle exits:

    - ``first_match_exit``: the earliest layer whose top-1 equals the final top-1. A gate
      that exits there is correct, so this is the bound on what any exit rule could save.
    - ``saturation_exit``: the earliest layer from which the top-1 stays equal up to L
      (the saturation layer); never earlier than the first match.
    """
    first_match = pl.when(pl.col("top1_match")).then(pl.col("layer")).otherwise(None).min()
    last_miss = pl.when(~pl.col("top1_match")).then(pl.col("layer")).otherwise(0).max()
    return (
        trace.lazy()
        .group_by("model", "run_id", "prompt_id", "position")
        .agg(
            pl.col("phase").first(),
            pl.col("num_layers").first(),
            first_match_exit=first_match.fill_null(pl.col("num_layers").first()),
            saturation_exit=last_miss + 1,
        )
        .sort("model", "run_id", "prompt_id", "position")
        .collect()
    )


def oracle_summary(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per model and phase (all, prefill, decode), for both oracle exits: the mean exit layer
    and the fraction of positions that could exit before L."""
    exits = oracle_exits(trace)
    both = pl.concat([exits.with_columns(phase=pl.lit("all")), exits])
    L = pl.col("num_layers")
    return (
        both.lazy()
        .group_by("model", "phase")
        .agg(
            mean_first_match=pl.col("first_match_exit").mean(),
            frac_first_match_before_L=(pl.col("first_match_exit") < L).mean(),
            mean_saturation=pl.col("saturation_exit").mean(),
            frac_saturation_before_L=(pl.col("saturation_exit") < L).mean(),
            positions=pl.len(),
            num_layers=L.first(),
        )
        .sort("model", "phase")
        .collect()
    )


def oracle_bound(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per model, the most any exit rule could save at agreement 1.0 on the trace: the mean over decision positions
    (``_decision_rows``) of the share of layers after the first one whose top-1 is the final top-1 (the first-match
    oracle, ``oracle_exits``): ``skippable`` = mean((L - first_match_exit) / L)."""
    decisions = _decision_rows(trace).select("model", "run_id", "prompt_id", "position").unique()
    exits = oracle_exits(trace).lazy().join(decisions, on=["model", "run_id", "prompt_id", "position"], how="semi")
    share = (pl.col("num_layers") - pl.col("first_match_exit")) / pl.col("num_layers")
    return exits.group_by("model").agg(skippable=share.mean(), positions=pl.len()).sort("model").collect()


def _decision_rows(trace: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """The rows at decision positions, where a gate decides: each prompt's last prefill position
    (its first generated token) and its decode positions, as ``sweep.trace.simulate.signals_from_trace``
    selects them (per model, run and prompt)."""
    last_prefill = (
        pl.when(pl.col("phase") == "prefill").then(pl.col("position")).max().over("model", "run_id", "prompt_id")
    )
    return trace.lazy().filter((pl.col("phase") == "decode") | (pl.col("position") == last_prefill))


def lens_curves(trace: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per model, readouts (``sweep fit``'s id) and layer, over the decision positions of traces
    taken with ``profile.readouts``: the top-1 agreement with the final layer's top-1 and the mean
    KL(final || lens) in nats, for the logit lens and the tuned lens. Empty without such traces."""
    return (
        _decision_rows(trace.lazy().filter(pl.col("tuned_match").is_not_null()))
        .group_by("model", "readouts_id", "layer")
        .agg(
            positions=pl.len(),
            prompts=pl.struct("run_id", "prompt_id").n_unique(),
            num_layers=pl.col("num_layers").first(),
            logit_top1=pl.col("top1_match").mean(),
            tuned_top1=pl.col("tuned_match").mean(),
            kl_logit=pl.col("kl_final").mean(),
            kl_tuned=pl.col("tuned_kl_final").mean(),
        )
        .sort("model", "readouts_id", "layer")
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
        lines.append(
            f"model {model}: L={L}, {sub.select(pl.struct('run_id', 'prompt_id', 'position').n_unique()).item()} "
            f"positions"
        )
        lines.append(
            f"{'layer':>5}  {'delta (median)':>14}  {'pca_delta (median)':>18}  {'top-1 agree':>11}  "
            f"{'margin (median)':>15}"
        )
        for row in curve.iter_rows(named=True):
            pca = "" if row["pca_delta_median"] is None else f"{row['pca_delta_median']:.4f}"
            lines.append(
                f"{row['layer']:>5}  {row['delta_median']:>14.4f}  {pca:>18}  {row['top1_agreement']:>11.3f}  "
                f"{row['margin_median']:>15.3f}"
            )
        eas = {r["variant"]: r["eas"] for r in eas_table(sub, alpha).iter_rows(named=True)}
        k = _single_topk(sub)
        lines.append(
            f"EAS (alpha={alpha:g}, K={k}, S averaged over all positions, A_l over l=1..{L - 1}): "
            f"hidden-cosine {eas['hidden']:.4f}  logit-cosine {eas['logits']:.4f}  top-{k} overlap {eas['topk']:.4f}"
        )
        for r in oracle_summary(sub).iter_rows(named=True):
            lines.append(
                f"oracle exit ({r['phase']} positions, n={r['positions']}): first match (the bound for any exit rule) "
                f"mean layer {r['mean_first_match']:.2f} of {L}, {100 * r['frac_first_match_before_L']:.1f}% before "
                f"layer {L}; "
                f"saturation (top-1 stays equal) mean layer {r['mean_saturation']:.2f}, "
                f"{100 * r['frac_saturation_before_L']:.1f}% before layer {L}"
            )
    return "\n".join(lines)
