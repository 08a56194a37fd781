"""The report's figures: each ``*_figure`` function writes one PNG into the report directory and returns its
file name; the ``draw_*`` function beside it returns the matplotlib figure it saves.

Pareto fronts with error bars and knees, the per-layer curves with the post-mortem's thresholds,
the learned readouts against the logit lens, EAS per layer, simulated against measured (screen),
and the batching effect.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

EPS_LINES = (0.05, 0.1, 0.2, 0.3)  # the post-mortem's saturation thresholds
THETA_LINES = (8, 14, 20)  # and its margin thresholds
HEADLINE_TARGET = 0.98


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path, name: str) -> str:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=DPI)
    plt.close(fig)
    return name


DPI = 110
AGREEMENT_BOUNDS = (-0.03, 1.03)  # the widest agreement axis: a fraction, with room for the markers at 0 and 1


def _fit(values, *, min_span: float, pad: float = 0.06, bounds: tuple[float, float] | None = None):
    """Axis limits around the finite ``values``: their range (at least ``min_span`` wide, centred), padded
    by ``pad`` of the span on each side, within ``bounds``."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    lo, hi = lo - pad * (hi - lo), hi + pad * (hi - lo)
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return lo, hi


def _fit_agreement(values) -> tuple[float, float]:
    """An agreement axis fitted to the points: 0-1 only when they spread over it."""
    return _fit(values, min_span=0.05, pad=0.05, bounds=AGREEMENT_BOUNDS)


def layer_ticks(first: int, last: int) -> list[int]:
    """Integer ticks for layers ``first``..``last`` (1-indexed): the first layer, then round multiples
    (the last layer too when it is not next to one)."""
    from matplotlib.ticker import MaxNLocator

    first = max(1, int(first))
    last = max(first, int(last))
    grid = [int(round(t)) for t in MaxNLocator(nbins=8, integer=True, steps=[1, 2, 5, 10]).tick_values(first, last)]
    step = grid[1] - grid[0] if len(grid) > 1 else 1
    ticks = [first] + [t for t in grid if first < t <= last and t - first >= step / 2]
    if last > ticks[-1] and last - ticks[-1] >= step / 2:
        ticks.append(last)
    return ticks


def _layer_axis(ax, layers) -> None:
    """A layer axis: integer ticks from the first layer drawn (never 0: layers are 1-indexed) to the last."""
    from matplotlib.ticker import FixedLocator

    first, last = max(1, int(min(layers))), int(max(layers))
    ax.set_xlim(first - 0.5, last + 0.5)
    ax.xaxis.set_major_locator(FixedLocator(layer_ticks(first, last)))


def _legend_outside(ax, **kwargs):
    """The legend right of the axes, where it hides no point."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kwargs)


MANY_POINTS = 300  # from this many trials of a gate, smaller and lighter markers keep the cloud readable


def pareto_figure(
    ok: pl.DataFrame, front: pl.DataFrame, knees: pl.DataFrame, model: str, out: Path, floor: float | None = None
) -> str:
    """One model's ok trials per gate with its front and knee (``draw_pareto``) as pareto_<model>.png."""
    return _save(draw_pareto(ok, front, knees, model, floor=floor), out, f"pareto_{model}.png")


def draw_pareto(ok: pl.DataFrame, front: pl.DataFrame, knees: pl.DataFrame, model: str, floor: float | None = None):
    """One model's ok trials per gate (95% intervals as error bars on the trials of its front across gates),
    that front (full depth a point of it) and the knee, and the model's A/A noise floor ``floor`` as a band
    around 1x. Both axes fit the points (an error bar that runs off is cut at the edge, its end written
    there); the legend and the knee's label sit right of the axes."""
    rows = ok.filter(pl.col("model") == model)
    metric = rows["speedup_metric"][0]
    line = front.filter((pl.col("model") == model) & (pl.col("front") == "model")).sort("speedup")
    on_front = line["trial_id"].to_list() if line.height else []
    knee = knees.filter((pl.col("model") == model) & (pl.col("front") == "model")) if knees.height else knees
    k = knee.row(0, named=True) if knee.height else None
    xs, ys = [1.0, *rows["speedup"].to_list()], [1.0, HEADLINE_TARGET, *rows["agreement"].to_list()]
    if k is not None:
        xs += [k["knee_all_speedup"], k["speedup"]]
        ys += [k["knee_all_agreement"], k["agreement"]]
    xlim, ylim = _fit(xs, min_span=0.1), _fit_agreement(ys)
    fig, ax = _pyplot().subplots(figsize=(12, 6))
    for gate, sub in sorted(rows.filter(pl.col("skipped_compute")).partition_by("gate", as_dict=True).items()):
        sub = sub.sort("speedup")
        many = sub.height >= MANY_POINTS
        (points,) = ax.plot(  # one marker line per gate: fast with thousands of points
            sub["speedup"].to_list(),
            sub["agreement"].to_list(),
            "o",
            ms=2.5 if many else 5,
            alpha=0.35 if many else 0.75,
            ls="none",
            label=f"{gate[0]} ({sub.height} trial{'s' if sub.height != 1 else ''})",
        )
        shown = sub.filter(pl.col("trial_id").is_in(on_front)) if "speedup_lo" in sub.columns else sub.clear()
        if shown.height:
            _clipped_error_bars(ax, shown, xlim, ylim, points.get_color())
    idle = rows.filter(~pl.col("skipped_compute"))
    if idle.height:
        ax.plot(
            idle["speedup"].to_list(),
            idle["agreement"].to_list(),
            "D",
            mfc="none",
            mec="dimgrey",
            ms=8,
            ls="none",
            label=f"skipped no compute ({idle.height}): capped at 1x from above",
        )
    if line.height:
        ax.plot(
            line["speedup"].to_list(),
            line["agreement"].to_list(),
            "-",
            color="black",
            lw=1.5,
            label="Pareto front (all gates)",
        )
    if k is not None and k["knee_all_trial_id"] != k["trial_id"]:
        ax.plot(
            [k["knee_all_speedup"]],
            [k["knee_all_agreement"]],
            marker="*",
            ms=14,
            mfc="none",
            mec="crimson",
            ls="none",
            label="unrestricted knee (all front points)",
        )
    if k is not None and k["trial_id"] is not None:
        floor_label = f"knee (chord, agreement >= {k['knee_min_agreement']:g})"
        ax.plot([k["speedup"]], [k["agreement"]], marker="*", ms=18, color="crimson", ls="none", label=floor_label)
        ax.annotate(  # the label right of the axes, under the legend: the arrow crosses the points, no box does
            f"knee: {k['gate']} {k['params']}\n{k['speedup']:.2f}x, agreement {k['agreement']:.3f}",
            (k["speedup"], k["agreement"]),
            xytext=(1.02, 0.0),
            textcoords="axes fraction",
            ha="left",
            va="bottom",
            fontsize=9,
            color="crimson",
            arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 1},
            bbox={"boxstyle": "round", "fc": "white", "ec": "crimson", "alpha": 0.9},
            annotation_clip=False,
        )
    ax.plot([1.0], [1.0], marker="s", ms=9, color="black", ls="none", label="full depth (1x, agreement 1)")
    if floor is not None:
        band = f"A/A noise floor ±{100 * floor:.1f}%: indistinguishable from 1x"
        ax.axvspan(1.0 / (1.0 + floor), 1.0 + floor, color="grey", alpha=0.15, label=band)
    ax.axvline(1.0, color="grey", ls="--", lw=1, label="no speedup (1x)")
    ax.axhline(HEADLINE_TARGET, color="grey", ls=":", lw=1, label=f"agreement {HEADLINE_TARGET}")
    what = "decode" if metric == "speedup_wall" else "whole-request (prefill + calibration + decode)"
    ax.set_xlabel(f"{metric}: full-depth {what} time / gated time")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title(f"{model}: {rows.height} ok trials; error bars (on the front): 95% bootstrap, prompts and rounds")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def _error_bars(sub: pl.DataFrame, metric: str) -> list[list[float]]:
    """Distances from the estimate down to its interval's low end and up to its high end (0 where missing)."""
    value = sub[metric]
    return [
        (value - sub[f"{metric}_lo"].fill_null(value)).clip(0).to_list(),
        (sub[f"{metric}_hi"].fill_null(value) - value).clip(0).to_list(),
    ]


OFF_AXIS = {("x", 0): "<", ("x", 1): ">", ("y", 0): "v", ("y", 1): "^"}  # the marker where a bar is cut


def _clipped_error_bars(ax, shown: pl.DataFrame, xlim, ylim, color) -> None:
    """The trials' speedup and agreement intervals as error bars cut at the axes' limits; a cut end gets
    an arrowhead at the edge and its value beside it, so one wide interval does not set the axis."""
    x, y = shown["speedup"].to_list(), shown["agreement"].to_list()
    bars = {"x": _error_bars(shown, "speedup"), "y": _error_bars(shown, "agreement")}
    shown_bars = {}
    for axis, (low, high), (lo, hi), values in (("x", bars["x"], xlim, x), ("y", bars["y"], ylim, y)):
        shown_bars[axis] = [
            [max(0.0, min(d, v - lo)) for v, d in zip(values, low)],
            [max(0.0, min(d, hi - v)) for v, d in zip(values, high)],
        ]
        for side, deltas in enumerate((low, high)):
            for v, other, d in zip(values, y if axis == "x" else x, deltas):
                end = v - d if side == 0 else v + d
                edge = lo if side == 0 else hi
                if (end < edge) if side == 0 else (end > edge):
                    at = (edge, other) if axis == "x" else (other, edge)
                    ax.plot(
                        *([c] for c in at), marker=OFF_AXIS[(axis, side)], ms=5, ls="none", color=color, clip_on=False
                    )
                    unit = "x" if axis == "x" else ""
                    ax.annotate(
                        f"{end:.2f}{unit}",
                        at,
                        xytext=(-4, 4) if side == 1 else (4, 4),
                        textcoords="offset points",
                        ha="right" if (axis, side) == ("x", 1) else "left",
                        va="bottom",
                        fontsize=7,
                        color=color,
                        annotation_clip=False,
                    )
    ax.errorbar(
        x,
        y,
        xerr=shown_bars["x"],
        yerr=shown_bars["y"],
        fmt="none",
        ecolor=color,
        alpha=0.75,
        capsize=2,
        elinewidth=0.8,
    )


def layers_figure(curve: pl.DataFrame, model: str, out: Path) -> str:
    """The per-layer signals (``draw_layers``) as layers_<model>.png."""
    return _save(draw_layers(curve, model), out, f"layers_{model}.png")


def draw_layers(curve: pl.DataFrame, model: str):
    """Median saturation delta (and pca delta), logit-lens top-1 agreement and median margin per layer,
    the post-mortem's thresholds dotted where they fall near the data (the others named in the legend)."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _pyplot().subplots(3, 1, figsize=(9.5, 10), sharex=True)
    deltas = curve["delta_median"].to_list()
    axes[0].plot(layers, deltas, "o-", ms=3, label="median saturation delta")
    if curve["pca_delta_median"].null_count() < curve.height:
        pca = curve["pca_delta_median"].to_list()
        deltas = deltas + pca
        axes[0].plot(layers, pca, "s-", ms=3, color="tab:purple", label="median pca_delta (lm_head subspace)")
    _threshold_lines(axes[0], deltas, "eps", EPS_LINES)
    axes[0].set_ylabel("relative change per layer")
    top1 = curve["top1_agreement"].to_list()
    axes[1].plot(layers, top1, "o-", ms=3, color="tab:green", label="logit-lens top-1 = final top-1")
    axes[1].set_ylabel("top-1 agreement (fraction)")
    axes[1].set_ylim(*_fit_agreement(top1))
    margins = curve["margin_median"].to_list()
    axes[2].plot(layers, margins, "o-", ms=3, color="tab:orange", label="median margin gamma_l")
    _threshold_lines(axes[2], margins, "theta", THETA_LINES)
    axes[2].set_ylabel("top1 - top2 (logits)")
    axes[2].set_xlabel("layer l (1-indexed; layers 1..l ran)")
    _layer_axis(axes[2], layers)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), borderaxespad=0.2, ncol=3, fontsize=8, frameon=False)
    fig.suptitle(
        f"{model}: per-layer signals of full-depth decoding ({curve['positions'][0]} positions), "
        "post-mortem thresholds dotted",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def lens_figure(curve: pl.DataFrame, model: str, readouts_id: str, out: Path) -> str:
    """One model's learned readouts against the logit lens per layer (``draw_lens``) as lens_<model>_<id>.png."""
    return _save(draw_lens(curve, model, readouts_id), out, f"lens_{model}_{readouts_id}.png")


def draw_lens(curve: pl.DataFrame, model: str, readouts_id: str):
    """One model's learned readouts against the logit lens per layer: top-1 agreement with the
    final top-1, and KL(final || lens) on a log axis (where it is 0, at layer L, not drawn)."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _pyplot().subplots(1, 2, figsize=(12, 4.5), sharex=True)
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
            ax.plot([], [], ls=":", lw=1, color="grey", label=f"{label} {', '.join(names)}: {side} this axis")


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
    """A_l per layer for the three similarity variants, every profiled model, its EAS in the legend; each
    panel on the 0-1 scale of A_l with the ceiling (S_l = 1 at every layer, and its EAS) dashed, so a score
    reads against what 0 and the most a model of that depth could reach mean."""
    variants = {"hidden": "hidden-state cosine", "logits": "logit cosine (centred)", "topk": "top-K overlap"}
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 5.2), sharey=True)
    score = {(r["model"], r["variant"]): r["eas"] for r in eas.iter_rows(named=True)}
    depths = sorted({int(v) for v in per_layer["num_layers"].unique().to_list()})
    for ax, (variant, label) in zip(axes, variants.items()):
        sub = per_layer.filter(pl.col("variant") == variant)
        for model in sorted(sub["model"].unique().to_list()):
            m = sub.filter(pl.col("model") == model).sort("layer")
            ax.plot(
                m["layer"].to_list(), m["a"].to_list(), "o-", ms=3, label=f"{model} (EAS {score[(model, variant)]:.3f})"
            )
        for L in depths:
            ceiling = eas_ceiling(L, alpha)
            what = f"L={L}, " if len(depths) > 1 else ""
            ax.plot(
                range(1, L + 1),
                ceiling,
                "--",
                color="grey",
                lw=1,
                label=f"ceiling, S_l = 1 at every layer ({what}EAS {sum(ceiling[:-1]) / (L - 1):.3f})",
            )
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_title(f"A_l, S = {label}")
        ax.set_xlabel("exit layer l")
        ax.set_ylim(-0.02, 1.02)
        _layer_axis(ax, [1, *depths])
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel(f"A_l = S_l^{alpha:g} * w_l^{1 - alpha:g}")
    fig.suptitle(
        f"Early-Exit Adaptability per layer (alpha={alpha:g}; EAS = mean of A_l over l < L)\n"
        "0: layer l's output shares nothing with layer L's (or exiting saves nothing, l = L); the dashed ceiling: "
        "every layer already the last one's. The higher, the more early exit can save (arXiv 2603.23701)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def screen_figure(both: pl.DataFrame, out: Path) -> str:
    """Simulated against measured settings (``draw_screen``) as screen.png."""
    return _save(draw_screen(both), out, "screen.png")


def draw_screen(both: pl.DataFrame):
    """Each simulated setting (hollow) joined to its closed-loop trial (filled), per gate; both axes fit the
    points, the legend right of them."""
    fig, ax = _pyplot().subplots(figsize=(11, 6))
    for gate, sub in sorted(both.partition_by("gate", as_dict=True).items()):
        line = ax.plot(
            sub["speedup_wall"].to_list(), sub["agreement"].to_list(), "o", label=f"{gate[0]}: measured (closed loop)"
        )[0]
        ax.plot(
            sub["speedup_model"].to_list(),
            sub["agreement_tf"].to_list(),
            "o",
            mfc="none",
            color=line.get_color(),
            label=f"{gate[0]}: simulated (teacher-forced)",
        )
        for r in sub.iter_rows(named=True):
            ax.plot(
                [r["speedup_model"], r["speedup_wall"]],
                [r["agreement_tf"], r["agreement"]],
                "-",
                lw=0.7,
                color=line.get_color(),
                alpha=0.6,
            )
    ax.axvline(1.0, color="grey", ls="--", lw=1, label="no speedup (1x)")
    ax.set_xlabel("speedup (simulated: cost model; measured: speedup_wall)")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title("Screen: each simulated setting (hollow) joined to its closed-loop trial (filled)")
    ax.set_xlim(*_fit([1.0, *both["speedup_wall"].to_list(), *both["speedup_model"].to_list()], min_span=0.1))
    ax.set_ylim(*_fit_agreement([*both["agreement"].to_list(), *both["agreement_tf"].to_list()]))
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def batching_figure(series: dict[str, pl.DataFrame], sizes: list[int], out: Path) -> str:
    """Speedup, decode-step layers saved and agreement against batch size, one line per setting."""
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 4.8))
    for setting, sub in series.items():
        b = sub["batch_size"].to_list()
        line = axes[0].plot(b, sub["speedup_wall"].to_list(), "o-", label=setting)[0]
        axes[0].plot(b, sub["speedup_model"].to_list(), "x--", color=line.get_color(), alpha=0.7)
        axes[1].plot(b, sub["step_layers_saved"].to_list(), "o-", color=line.get_color())
        axes[2].plot(b, sub["agreement"].to_list(), "o-", color=line.get_color())
    labels = ("speedup (o measured wall, x cost model)", "decode-step layers saved (fraction)", "agreement (fraction)")
    for ax, label in zip(axes, labels):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size (sequences)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="grey", ls="--", lw=1)
    axes[0].legend(fontsize=7)
    fig.suptitle("The batching effect: early exit saves compute only when every sequence of the batch has exited")
    fig.tight_layout()
    return _save(fig, out, "batching.png")


def skip_map_figure(maps: list[tuple[str, str, int]], out: Path) -> str:
    """Each model's best skip set as a layer map: attention and MLP (rows) of layers 1..L (columns), the
    bypassed sublayers filled. ``maps``: (model, canonical skip text, L)."""
    from sweep.config.skipset import SkipSet

    plt = _pyplot()
    fig, axes = plt.subplots(len(maps), 1, figsize=(10, 1.1 + 1.0 * len(maps)), squeeze=False)
    for ax, (model, text, L) in zip(axes[:, 0], maps):
        skip = SkipSet.parse(text)
        grid = [
            [layer in skip.attention for layer in range(1, L + 1)],
            [layer in skip.mlp for layer in range(1, L + 1)],
        ]
        ax.imshow(grid, cmap="Greys", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
        ax.set_yticks([0, 1], ["attention", "MLP"])
        step = max(1, L // 15)
        ax.set_xticks(range(0, L, step), [str(i + 1) for i in range(0, L, step)])  # layers are 1-indexed
        ax.set_xticks([i - 0.5 for i in range(L + 1)], minor=True)
        ax.set_yticks([-0.5, 0.5, 1.5], minor=True)
        ax.grid(which="minor", color="white", lw=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{model}: skip {text} (ratio {skip.ratio(L):.2f}; dark: bypassed)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("layer")
    fig.tight_layout()
    return _save(fig, out, "skip_sets.png")
