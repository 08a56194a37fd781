"""The report's figures: each function draws one PNG into the report directory and returns its file name.

Pareto fronts with error bars and knees, the per-layer curves with the post-mortem's thresholds,
the learned readouts against the logit lens, EAS per layer, simulated against measured (screen),
and the batching effect.
"""

from __future__ import annotations

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
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


MANY_POINTS = 300  # from this many trials of a gate, smaller and lighter markers keep the cloud readable


def pareto_figure(
    ok: pl.DataFrame, front: pl.DataFrame, knees: pl.DataFrame, model: str, out: Path, floor: float | None = None
) -> str:
    """One model's ok trials per gate (95% intervals as error bars on the trials of its front across gates),
    that front (full depth a point of it) and the knee, and the model's A/A noise floor ``floor`` as a band
    around 1x."""
    rows = ok.filter(pl.col("model") == model)
    metric = rows["speedup_metric"][0]
    line = front.filter((pl.col("model") == model) & (pl.col("front") == "model")).sort("speedup")
    on_front = line["trial_id"].to_list() if line.height else []
    fig, ax = _pyplot().subplots(figsize=(8.5, 6))
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
            label=f"{gate[0]} ({sub.height} trials)",
        )
        shown = sub.filter(pl.col("trial_id").is_in(on_front)) if "speedup_lo" in sub.columns else sub.clear()
        if shown.height:
            ax.errorbar(
                shown["speedup"].to_list(),
                shown["agreement"].to_list(),
                xerr=_error_bars(shown, "speedup"),
                yerr=_error_bars(shown, "agreement"),
                fmt="none",
                ecolor=points.get_color(),
                alpha=0.75,
                capsize=2,
                elinewidth=0.8,
            )
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
    knee = knees.filter((pl.col("model") == model) & (pl.col("front") == "model")) if knees.height else knees
    k = knee.row(0, named=True) if knee.height else None
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
        ax.annotate(
            f"knee: {k['gate']} {k['params']}\n{k['speedup']:.2f}x, agreement {k['agreement']:.3f}",
            (k["speedup"], k["agreement"]),
            xytext=(0.97, 0.55),
            textcoords="axes fraction",
            ha="right",
            fontsize=9,
            color="crimson",
            arrowprops={"arrowstyle": "->", "color": "crimson", "lw": 1},
            bbox={"boxstyle": "round", "fc": "white", "ec": "crimson", "alpha": 0.9},
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
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    return _save(fig, out, f"pareto_{model}.png")


def _error_bars(sub: pl.DataFrame, metric: str) -> list[list[float]]:
    """Distances from the estimate down to its interval's low end and up to its high end (0 where missing)."""
    value = sub[metric]
    return [
        (value - sub[f"{metric}_lo"].fill_null(value)).clip(0).to_list(),
        (sub[f"{metric}_hi"].fill_null(value) - value).clip(0).to_list(),
    ]


def layers_figure(curve: pl.DataFrame, model: str, out: Path) -> str:
    """Median saturation delta (and pca delta), logit-lens top-1 agreement and median margin per layer."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _pyplot().subplots(3, 1, figsize=(8.5, 9), sharex=True)
    axes[0].plot(layers, curve["delta_median"].to_list(), "o-", ms=3, label="median saturation delta")
    if curve["pca_delta_median"].null_count() < curve.height:
        axes[0].plot(
            layers,
            curve["pca_delta_median"].to_list(),
            "s-",
            ms=3,
            color="tab:purple",
            label="median pca_delta (lm_head subspace)",
        )
    _threshold_lines(axes[0], layers[-1], "eps", EPS_LINES)
    axes[0].set_ylabel("relative change per layer")
    axes[1].plot(
        layers, curve["top1_agreement"].to_list(), "o-", ms=3, color="tab:green", label="logit-lens top-1 = final top-1"
    )
    axes[1].set_ylabel("top-1 agreement (fraction)")
    axes[1].set_ylim(-0.03, 1.03)
    axes[2].plot(
        layers, curve["margin_median"].to_list(), "o-", ms=3, color="tab:orange", label="median margin gamma_l"
    )
    _threshold_lines(axes[2], layers[-1], "theta", THETA_LINES)
    axes[2].set_ylabel("top1 - top2 (logits)")
    axes[2].set_xlabel("layer l (1-indexed; layers 1..l ran)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"{model}: per-layer signals of full-depth decoding ({curve['positions'][0]} positions), "
        "post-mortem thresholds dotted",
        fontsize=10,
    )
    return _save(fig, out, f"layers_{model}.png")


def lens_figure(curve: pl.DataFrame, model: str, readouts_id: str, out: Path) -> str:
    """One model's learned readouts against the logit lens per layer: top-1 agreement with the
    final top-1, and KL(final || lens) on a log axis (where it is 0, at layer L, not drawn)."""
    curve = curve.sort("layer")
    layers = curve["layer"].to_list()
    fig, axes = _pyplot().subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for lens, style in (("logit", "o-"), ("tuned", "s-")):
        axes[0].plot(layers, curve[f"{lens}_top1"].to_list(), style, ms=3, label=f"{lens} lens")
        kl = [v if v is not None and v > 0 else float("nan") for v in curve[f"kl_{lens}"].to_list()]
        axes[1].plot(layers, kl, style, ms=3, label=f"{lens} lens")
    axes[0].set_ylabel("top-1 = final top-1 (fraction)")
    axes[0].set_ylim(-0.03, 1.03)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("mean KL(final || lens), nats (0 not drawn)")
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer l (1-indexed; layers 1..l ran)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{model}: tuned lens (readouts {readouts_id}) vs logit lens, "
        f"{curve['positions'][0]} decision positions of the evaluation prompts",
        fontsize=10,
    )
    return _save(fig, out, f"lens_{model}_{readouts_id}.png")


def _threshold_lines(ax, last_layer: int, label: str, values: tuple[float, ...]) -> None:
    for value in values:
        ax.axhline(value, ls=":", lw=1, color="grey")
        ax.annotate(f"{label} {value}", (last_layer, value), fontsize=8, color="grey", ha="right", va="bottom")


def eas_figure(per_layer: pl.DataFrame, eas: pl.DataFrame, alpha: float, out: Path) -> str:
    """A_l per layer for the three similarity variants, every profiled model, its EAS in the legend."""
    variants = {"hidden": "hidden-state cosine", "logits": "logit cosine (centred)", "topk": "top-K overlap"}
    fig, axes = _pyplot().subplots(1, 3, figsize=(14, 4.5), sharey=True)
    score = {(r["model"], r["variant"]): r["eas"] for r in eas.iter_rows(named=True)}
    for ax, (variant, label) in zip(axes, variants.items()):
        sub = per_layer.filter(pl.col("variant") == variant)
        for model in sorted(sub["model"].unique().to_list()):
            m = sub.filter(pl.col("model") == model).sort("layer")
            ax.plot(
                m["layer"].to_list(), m["a"].to_list(), "o-", ms=3, label=f"{model} (EAS {score[(model, variant)]:.3f})"
            )
        ax.set_title(f"A_l, S = {label}")
        ax.set_xlabel("exit layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"A_l = S_l^{alpha:g} * w_l^{1 - alpha:g}")
    fig.suptitle(f"Early-Exit Adaptability per layer (alpha={alpha:g}; EAS = mean of A_l over l < L)")
    return _save(fig, out, "eas.png")


def screen_figure(both: pl.DataFrame, out: Path) -> str:
    """Each simulated setting (hollow) joined to its closed-loop trial (filled), per gate."""
    fig, ax = _pyplot().subplots(figsize=(8.5, 6))
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
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set_xlabel("speedup (simulated: cost model; measured: speedup_wall)")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title("Screen: each simulated setting (hollow) joined to its closed-loop trial (filled)")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out, "screen.png")


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
