"""The per-layer figures: signals by layer with their thresholds, the learned readouts' curves, and EAS with
its ceiling."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from sweep.report.plotting import _fit, _fit_agreement, _layer_axis, _figure, _save

EPS_LINES = (0.05, 0.1, 0.2, 0.3)  # the post-mortem's saturation thresholds


THETA_LINES = (8, 14, 20)  # and its margin thresholds


def layers_figure(curve: pl.DataFrame, model: str, out: Path) -> str:
    """The per-layer signals (``draw_layers``) as layers_<model>.png."""
    return _save(draw_layers(curve, model), out, f"layers_{model}.png")


def draw_layers(curve: pl.DataFrame, model: str):
    """Median saturation delta (and pca delta), logit-lens top-1 agreement and median margin per layer,
    the post-mortem's thresholds dotted where they fall near the data (the others named in the legend)."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _figure(3, 1, figsize=(9.5, 10), sharex=True)
    deltas = curve["delta_median"].to_list()
    axes[0].plot(layers, deltas, "o-", ms=3, label="median saturation delta")
    spread = _band(axes[0], curve, "delta", "tab:blue", "steps under an eps line exit")
    if curve["pca_delta_median"].null_count() < curve.height:
        pca = curve["pca_delta_median"].to_list()
        deltas = deltas + pca
        axes[0].plot(layers, pca, "s-", ms=3, color="tab:purple", label="median pca_delta (lm_head subspace)")
    _threshold_lines(axes[0], deltas + spread, "eps", EPS_LINES)
    axes[0].set_ylabel("relative change per layer")
    top1 = curve["top1_agreement"].to_list()
    axes[1].plot(layers, top1, "o-", ms=3, color="tab:green", label="logit-lens top-1 = final top-1")
    axes[1].set_ylabel("top-1 agreement (fraction)")
    axes[1].set_ylim(*_fit_agreement(top1))
    margins = curve["margin_median"].to_list()
    axes[2].plot(layers, margins, "o-", ms=3, color="tab:orange", label="median margin gamma_l")
    band = _band(axes[2], curve, "margin", "tab:orange", "steps over a theta line exit")
    _threshold_lines(axes[2], margins + band, "theta", THETA_LINES)
    axes[2].set_ylabel("top1 - top2 (logits)")
    axes[2].set_xlabel("layer l (1-indexed; layers 1..l ran)")
    _layer_axis(axes[2], layers)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2, ncol=2, fontsize=8, frameon=False)
    fig.suptitle(
        f"{model}: per-layer signals of full-depth decoding ({curve['positions'][0]} positions), "
        "post-mortem thresholds dotted",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _band(ax, curve: pl.DataFrame, signal: str, color: str, meaning: str) -> list[float]:
    """The 10th-90th percentile band of ``signal`` per layer (a threshold under the median still fires on the
    steps beyond it), where the curve has it; its values, for the panel's range."""
    if f"{signal}_q10" not in curve.columns:
        return []
    lo, hi = curve[f"{signal}_q10"].to_list(), curve[f"{signal}_q90"].to_list()
    layers = curve["layer"].to_list()
    ax.fill_between(layers, lo, hi, color=color, alpha=0.15, label=f"10th-90th percentile ({meaning})")
    return [v for v in (*lo, *hi) if v is not None]


def lens_figure(curve: pl.DataFrame, model: str, readouts_id: str, out: Path) -> str:
    """One model's learned readouts against the logit lens per layer (``draw_lens``) as lens_<model>_<id>.png."""
    return _save(draw_lens(curve, model, readouts_id), out, f"lens_{model}_{readouts_id}.png")


def draw_lens(curve: pl.DataFrame, model: str, readouts_id: str):
    """One model's learned readouts against the logit lens per layer: top-1 agreement with the
    final top-1, and KL(final || lens) on a log axis (where it is 0, at layer L, not drawn)."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _figure(1, 2, figsize=(12, 4.5), sharex=True)
    top1 = []
    for lens, style in (("logit", "o-"), ("tuned", "s-")):
        top1 += curve[f"{lens}_top1"].to_list()
        axes[0].plot(layers, curve[f"{lens}_top1"].to_list(), style, ms=3, label=f"{lens} lens")
        kl = [v if v is not None and v > 0 else float("nan") for v in curve[f"kl_{lens}"].to_list()]
        axes[1].plot(layers, kl, style, ms=3, label=f"{lens} lens")
    axes[0].set_ylabel("top-1 = final top-1 (fraction)")
    axes[0].set_ylim(*_fit_agreement(top1))
    axes[1].set_yscale("log")
    axes[1].set_ylabel("mean KL(final || lens), nats (0 not drawn)")
    _layer_axis(axes[0], layers)
    for ax in axes:
        ax.set_xlabel("layer l (1-indexed; layers 1..l ran)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{model}: tuned lens (readouts {readouts_id}) vs logit lens, "
        f"{curve['positions'][0]} decision positions of the evaluation prompts",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


LABEL_GAP = 0.075  # the least distance between two threshold labels, in fractions of the panel's height


def _threshold_lines(ax, data: list[float], label: str, values: tuple[float, ...]) -> None:
    """Threshold lines on a panel whose y-range the data set: the thresholds nearest the data are taken in
    while the range stays within twice the data's own (so the data fill half the panel or more); the others
    are named in the legend as off the axis. Labels right of the axes, spread apart so none overlaps."""
    vals = [float(v) for v in data if v is not None and math.isfinite(v)]
    d_lo, d_hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    span = max(d_hi - d_lo, 1e-9)
    lo, hi, drawn = d_lo, d_hi, []
    for value in sorted(values, key=lambda v: max(d_lo - v, v - d_hi, 0.0)):
        if max(hi, value) - min(lo, value) <= 2 * span:
            lo, hi = min(lo, value), max(hi, value)
            drawn.append(value)
    ylim = _fit([lo, hi], min_span=1e-6)
    ax.set_ylim(*ylim)
    for value in drawn:
        ax.axhline(value, ls=":", lw=1, color="grey")
    drawn.sort()
    wanted = [(v - ylim[0]) / (ylim[1] - ylim[0]) for v in drawn]
    for value, at, want in zip(drawn, _spread(wanted, LABEL_GAP), wanted):
        ax.annotate(
            f"{label} {value:g}",
            (1.0, value),
            xycoords=ax.get_yaxis_transform(),
            xytext=(1.01, at),
            textcoords="axes fraction",
            va="center",
            ha="left",
            fontsize=8,
            color="grey",
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5} if abs(at - want) > 1e-9 else None,
        )
    above = [f"{v:g}" for v in values if v not in drawn and v > hi]
    below = [f"{v:g}" for v in values if v not in drawn and v < lo]
    for side, names in (("above", above), ("below", below)):
        if names:
            where = "above" if side == "above" else "below"
            text = f"{label} {', '.join(names)}: off the panel, {where} every value"
            ax.plot([], [], ls=":", lw=1, color="grey", label=text)


def _spread(positions: list[float], gap: float) -> list[float]:
    """Ascending label positions (fractions of the panel) moved apart to at least ``gap``, kept within 0..1
    where they fit."""
    out = list(positions)
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1] + gap)
    top = max(1.0, (len(out) - 1) * gap)
    for i in range(len(out) - 1, -1, -1):
        out[i] = min(out[i], top if i == len(out) - 1 else out[i + 1] - gap)
    return out


def eas_figure(per_layer: pl.DataFrame, eas: pl.DataFrame, alpha: float, out: Path) -> str:
    """A_l per layer (``draw_eas``) as eas.png."""
    return _save(draw_eas(per_layer, eas, alpha), out, "eas.png")


def eas_ceiling(num_layers: int, alpha: float) -> list[float]:
    """A_l of a model whose every layer already equals the last one (S_l = 1): w_l^(1 - alpha), l = 1..L,
    the most A_l can be at each layer."""
    return [((num_layers - layer) / num_layers) ** (1.0 - alpha) for layer in range(1, num_layers + 1)]


def draw_eas(per_layer: pl.DataFrame, eas: pl.DataFrame, alpha: float):
    """A_l against relative depth l/L for the three similarity variants, every profiled model (models of different
    depth side by side), its EAS in the legend; each panel on the 0-1 scale of A_l with the ceiling (S_l = 1 at
    every layer) dashed, once per depth whose ceiling differs, so a score reads against what 0 and the most a
    model of that depth could reach mean. The legend sits below the panels, off the ceilings."""
    variants = {"hidden": "hidden-state cosine", "logits": "logit cosine (centred)", "topk": "top-K overlap"}
    fig, axes = _figure(1, 3, figsize=(15, 5.8), sharey=True)
    score = {(r["model"], r["variant"]): r["eas"] for r in eas.iter_rows(named=True)}
    depths = sorted({int(v) for v in per_layer["num_layers"].unique().to_list()})
    for ax, (variant, label) in zip(axes, variants.items()):
        sub = per_layer.filter(pl.col("variant") == variant)
        for model in sorted(sub["model"].unique().to_list()):
            m = sub.filter(pl.col("model") == model).sort("layer")
            depth = m["num_layers"].cast(pl.Float64)
            (h,) = ax.plot((m["layer"] / depth).to_list(), m["a"].to_list(), "o-", ms=3)
            h.set_label(f"{model} (L={int(depth[0])}): EAS {score[(model, variant)]:.3f}")
        drawn: list[list[float]] = []
        for L in depths:
            ceiling = eas_ceiling(L, alpha)
            rel = [layer / L for layer in range(1, L + 1)]
            if any(len(c) == len(rel) and max(abs(a - b) for a, b in zip(c, ceiling)) < 1e-3 for c in drawn):
                continue  # the same ceiling already drawn
            drawn.append(ceiling)
            what = f"L={L}: " if len(depths) > 1 else ""
            ax.plot(
                rel, ceiling, "--", color="grey", lw=1, label=f"ceiling, {what}EAS {sum(ceiling[:-1]) / (L - 1):.3f}"
            )
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_title(f"A_l, S = {label}")
        ax.set_xlabel("relative depth l / L")
        ax.set_xlim(0.0, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False, ncol=1)
    axes[0].set_ylabel(f"A_l = S_l^{alpha:g} * w_l^{1 - alpha:g}")
    fig.suptitle(
        f"Early-Exit Adaptability per layer (alpha={alpha:g}; EAS = mean of A_l over l < L)\n"
        "0: layer l's output shares nothing with layer L's (or exiting saves nothing, l = L)\n"
        "dashed: the ceiling, every layer already the last one's (S_l = 1); the higher, the more early exit can save "
        "(arXiv 2603.23701)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
