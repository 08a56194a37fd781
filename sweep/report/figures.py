"""The report's figures: each ``*_figure`` function writes one PNG into the report directory and returns its
file name; the ``draw_*`` function beside it returns the matplotlib figure it saves.

Pareto fronts with error bars and knees, the per-layer curves with the post-mortem's thresholds,
the learned readouts against the logit lens, EAS per layer, simulated against measured (screen),
and the batching effect.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sweep.textfit import counted
from sweep.report.plotting import HEADLINE_TARGET, _fit, _fit_agreement, _legend_outside, _figure, _save

MANY_POINTS = 300  # from this many trials of a gate, smaller and lighter markers keep the cloud readable


def pareto_figure(
    ok: pl.DataFrame,
    front: pl.DataFrame,
    knees: pl.DataFrame,
    model: str,
    out: Path,
    floor: float | None = None,
    target: float = HEADLINE_TARGET,
) -> str:
    """One model's ok trials per gate with its front and knee (``draw_pareto``) as pareto_<model>.png."""
    return _save(draw_pareto(ok, front, knees, model, floor=floor, target=target), out, f"pareto_{model}.png")


def draw_pareto(
    ok: pl.DataFrame,
    front: pl.DataFrame,
    knees: pl.DataFrame,
    model: str,
    floor: float | None = None,
    target: float = HEADLINE_TARGET,
):
    """One model's ok trials per gate at their ranked speedup (95% intervals as error bars on the trials of its
    front across gates), that front as steps (full depth a point of it, drawn hollow under the trials), the knee,
    and for each front trial its own A/A noise floor, the one its rank used. A trial that ranks elsewhere than it
    measured (capped at 1x, or 1x inside its floor) has its measured ratio beside it, joined by a dotted line.
    ``floor``: the model's pooled floor, named in the title only (ranking used each trial's own). Both axes fit
    the points (an error bar that runs off is cut at the edge, its end written there); the legend and the knee's
    label sit right of the axes. A tiny model's title says its weights are random."""
    rows = ok.filter(pl.col("model") == model)
    metric = rows["speedup_metric"][0]
    line = front.filter((pl.col("model") == model) & (pl.col("front") == "model")).sort("speedup")
    on_front = line["trial_id"].to_list() if line.height else []
    knee = knees.filter((pl.col("model") == model) & (pl.col("front") == "model")) if knees.height else knees
    k = knee.row(0, named=True) if knee.height else None
    unrestricted = k is not None and k["knee_all_trial_id"] != k["trial_id"]
    unrestricted = unrestricted and (k["knee_all_agreement"] or 0.0) >= (k.get("knee_min_agreement") or 0.0)
    measured = rows.filter(pl.col(metric).is_not_null() & ((pl.col(metric) - pl.col("speedup")).abs() > 1e-9))
    xs, ys = [1.0, *rows["speedup"].to_list(), *measured[metric].to_list()], [1.0, target]
    ys += rows["agreement"].to_list()
    if k is not None and k["trial_id"] is not None:
        xs, ys = xs + [k["speedup"]], ys + [k["agreement"]]
    if unrestricted:
        xs, ys = xs + [k["knee_all_speedup"]], ys + [k["knee_all_agreement"]]
    xlim, ylim = _fit(xs, min_span=0.1), _fit_agreement(ys)
    fig, ax = _figure(figsize=(12, 6))
    ax.plot(  # under the trials: a trial at (1x, 1.0) shows through it
        [1.0],
        [1.0],
        marker="s",
        ms=11,
        mfc="none",
        mec="black",
        mew=1.5,
        ls="none",
        zorder=1,
        label="full depth (1x, agreement 1)",
    )
    floors = line.filter(pl.col("trial_id") != "full-depth") if line.height else line
    if floors.height and "speedup_floor" in floors.columns:
        first = True
        for r in floors.filter(pl.col("speedup_floor").is_not_null()).iter_rows(named=True):
            f = r["speedup_floor"]
            ax.plot(
                [1.0 / (1.0 + f), 1.0 + f],
                [r["agreement"], r["agreement"]],
                "-",
                color="grey",
                lw=4,
                alpha=0.25,
                solid_capstyle="butt",
                zorder=1,
                label="a front trial's own A/A noise floor around 1x (inside it, it ranks 1x)" if first else None,
            )
            first = False
    if measured.height:
        for r in measured.iter_rows(named=True):
            ax.plot([r["speedup"], r[metric]], [r["agreement"], r["agreement"]], ":", color="grey", lw=0.8, zorder=2)
        ax.plot(
            measured[metric].to_list(),
            measured["agreement"].to_list(),
            "x",
            color="grey",
            ms=5,
            ls="none",
            zorder=2,
            label=f"measured {metric}, where it ranks otherwise (capped at 1x, or 1x inside its floor)",
        )
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
            zorder=3,
            label=f"{gate[0]} ({counted(sub.height, 'trial')}), at its ranked speedup",
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
            zorder=3,
            label=f"skipped no compute ({idle.height}): capped at 1x from above",
        )
    if line.height:
        ax.step(  # no setting lies between two front points: the best speedup holds until the next one's agreement
            line["speedup"].to_list(),
            line["agreement"].to_list(),
            "-",
            where="pre",
            color="black",
            lw=1.5,
            zorder=2,
            label="Pareto front (all gates), as steps: the best speedup at each agreement",
        )
    if unrestricted:
        ax.plot(
            [k["knee_all_speedup"]],
            [k["knee_all_agreement"]],
            marker="*",
            ms=14,
            mfc="none",
            mec="crimson",
            ls="none",
            zorder=4,
            label="unrestricted knee (all front points)",
        )
    if k is not None and k["trial_id"] is not None:
        floor_label = f"knee (chord, agreement >= {k['knee_min_agreement']:g})"
        ax.plot(
            [k["speedup"]], [k["agreement"]], marker="*", ms=18, color="crimson", ls="none", zorder=4, label=floor_label
        )
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
    ax.axvline(1.0, color="grey", ls="--", lw=1, label="no speedup (1x)")
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"agreement {target}")
    what = "decode" if metric == "speedup_wall" else "whole-request (prefill + calibration + decode)"
    ax.set_xlabel(f"ranked speedup (from {metric}: full-depth {what} time / gated time)")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    random = "model_source" in rows.columns and (rows["model_source"] == "tiny").any()
    title = f"{model}: {rows.height} ok trials; error bars (on the front): 95% bootstrap, prompts and rounds"
    if floor is not None:
        title += f"\nthe model's pooled A/A floor is ±{100 * floor:.1f}%; each trial ranks by its own"
    if random:
        title += "\nrandom weights (a tiny model built from a config): the mechanics, not a model's quality"
    ax.set_title(title, fontsize=10)
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


def screen_figure(both: pl.DataFrame, out: Path) -> str:
    """Simulated against measured settings (``draw_screen``) as screen.png."""
    return _save(draw_screen(both), out, "screen.png")


def draw_screen(both: pl.DataFrame):
    """Each simulated setting (hollow) and its closed-loop trial (filled), per gate, a pair named by one number
    beside both points (lines joining the pairs would cross); a measured point's horizontal bar is its own A/A
    noise floor (``speedup_floor``), so a ratio that noise alone could give reads as such, not as a cost model's
    miss. Both axes fit the points, the legend right of them."""
    fig, ax = _figure(figsize=(11, 6))
    both = both.sort("gate", "agreement_tf", descending=[False, True])
    number = 0
    for gate, sub in sorted(both.partition_by("gate", as_dict=True).items()):
        x, y = sub["speedup_wall"].to_list(), sub["agreement"].to_list()
        floors = sub["speedup_floor"].to_list() if "speedup_floor" in sub.columns else [None] * sub.height
        err = [v * f if f is not None and v is not None else 0.0 for v, f in zip(x, floors)]
        bars = ax.errorbar(
            x,
            y,
            xerr=err,
            fmt="o",
            capsize=3,
            elinewidth=0.9,
            label=f"{gate[0]}: measured (closed loop), bar: its own A/A noise floor",
        )
        color = bars[0].get_color()
        ax.plot(
            sub["speedup_model"].to_list(),
            sub["agreement_tf"].to_list(),
            "o",
            mfc="none",
            color=color,
            label=f"{gate[0]}: simulated (teacher-forced, cost model)",
        )
        for r in sub.iter_rows(named=True):
            number += 1
            for px, py in ((r["speedup_model"], r["agreement_tf"]), (r["speedup_wall"], r["agreement"])):
                ax.annotate(str(number), (px, py), xytext=(4, 3), textcoords="offset points", fontsize=7, color=color)
    ax.axvline(1.0, color="grey", ls="--", lw=1, label="no speedup (1x)")
    ax.set_xlabel("speedup (simulated: cost model; measured: speedup_wall)")
    ax.set_ylabel("agreement with full-depth greedy tokens (fraction)")
    ax.set_title("Screen: each simulated setting (hollow) and its closed-loop trial (filled) share a number")
    ax.set_xlim(*_fit([1.0, *both["speedup_wall"].to_list(), *both["speedup_model"].to_list()], min_span=0.1))
    ax.set_ylim(*_fit_agreement([*both["agreement"].to_list(), *both["agreement_tf"].to_list()]))
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def batching_figure(series: dict[str, pl.DataFrame], sizes: list[int], out: Path) -> str:
    """Speedup, decode-step layers saved and agreement against batch size, one line per setting."""
    fig, axes = _figure(1, 3, figsize=(15, 4.8))
    for setting, sub in series.items():
        b = sub["batch_size"].to_list()
        line = axes[0].plot(b, sub["speedup"].to_list(), "o-", label=setting)[0]  # ranked: 1 inside the floor
        axes[0].plot(b, sub["speedup_model"].to_list(), "x--", color=line.get_color(), alpha=0.7)
        axes[1].plot(b, sub["step_layers_saved"].to_list(), "o-", color=line.get_color())
        axes[2].plot(b, sub["agreement"].to_list(), "o-", color=line.get_color())
    labels = (
        "speedup (o ranked: wall, 1 inside its floor; x cost model)",
        "decode-step layers saved (fraction)",
        "agreement (fraction)",
    )
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


def skip_map_rows(skip, L: int) -> list[tuple[str, list[bool]]]:
    """The skip-set figure's rows for one set on a model of ``L`` layers: (label, bypassed per layer 1..L).
    Attention and MLP always; a row of state-space mixers where the set bypasses any (a hybrid's); an
    attention-free set fills its attention row, labelled as every attention sublayer the model has."""
    layers = range(1, L + 1)
    attention = (
        ("attention (all it has)", [True] * L)
        if skip.every_attention
        else ("attention", [i in skip.attention for i in layers])
    )
    rows = [attention, ("MLP", [i in skip.mlp for i in layers])]
    if skip.mixer:
        rows.append(("mixer", [i in skip.mixer for i in layers]))
    return rows


def skip_map_figure(maps: list[tuple[str, str, int, float | None]], out: Path) -> str:
    """Each model's best skip set as a layer map: attention, MLP and, where bypassed, state-space mixers (rows,
    ``skip_map_rows``) of layers 1..L (columns), the bypassed sublayers filled. ``maps``: (model, canonical skip
    text, L, the row's skip_ratio: over the model's own skippable sublayers, |S| / 2L where the row has none)."""
    from sweep.gates.skipset import SkipSet

    sets = [SkipSet.parse(text) for _, text, _, _ in maps]
    rows = [skip_map_rows(skip, L) for skip, (_, _, L, _) in zip(sets, maps)]
    fig, axes = _figure(len(maps), 1, figsize=(10, 0.8 + 0.5 * sum(len(r) for r in rows)), squeeze=False)
    for ax, (model, text, L, ratio), skip, named in zip(axes[:, 0], maps, sets, rows):
        ratio = skip.ratio(L) if ratio is None else ratio
        ax.imshow([cells for _, cells in named], cmap="Greys", vmin=0, vmax=1.4, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(named)), [label for label, _ in named])
        step = max(1, L // 15)
        ax.set_xticks(range(0, L, step), [str(i + 1) for i in range(0, L, step)])  # layers are 1-indexed
        ax.set_xticks([i - 0.5 for i in range(L + 1)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(len(named) + 1)], minor=True)
        ax.grid(which="minor", color="white", lw=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{model}: skip {text} (ratio {ratio:.2f}; dark: bypassed)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("layer")
    fig.tight_layout()
    return _save(fig, out, "skip_sets.png")
