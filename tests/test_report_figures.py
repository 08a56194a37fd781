"""The report's figures as a reader sees them, checked on the matplotlib objects the drawing functions
return: no legend over the data, axes fitted to the points (one wide interval does not set the speedup
axis, points near agreement 0 are not squeezed on a 0-1 axis), layer axes of integers from layer 1,
threshold lines that do not set a panel's range and labels that do not overlap, EAS against its ceiling.
Small synthetic frames through the analysis functions the report uses."""

from __future__ import annotations

import itertools

import polars as pl
import pytest
from matplotlib.text import Text

from sweep.analysis import eas_per_layer, eas_table, fronts, knees_table, layer_curve, ok_trials
from sweep.report.figures import draw_pareto, draw_screen
from sweep.report.figures_layers import EPS_LINES, THETA_LINES, draw_eas, draw_layers, draw_lens, eas_ceiling
from sweep.report.plotting import layer_ticks

L = 30  # SmolLM2-135M's depth


def trials(points, intervals) -> pl.DataFrame:
    """Ok trial rows of one model, (trial_id, gate, speedup_wall, agreement), ranked, with the speedup
    and agreement intervals ``intervals`` (trial_id -> (speedup_lo, speedup_hi, agreement_lo, agreement_hi))."""
    frame = pl.DataFrame(
        [
            {
                "trial_id": t,
                "model": "m",
                "gate": gate,
                "status": "ok",
                "eps": 0.1,
                "theta": None,
                "min_layer": 8,
                "speedup_wall": s,
                "agreement": a,
                "exit_rate": 0.5,
                "step_layers_saved": 0.3,
                "kv_policy": "propagate",
                "mode": "early_exit",
                "noise_floor": 0.05,
            }
            for t, gate, s, a in points
        ]
    )
    ok = ok_trials(frame).collect()
    ci = pl.DataFrame(
        [(t, *bounds) for t, bounds in intervals.items()],
        schema={
            "trial_id": pl.String,
            **{c: pl.Float64 for c in ("speedup_lo", "speedup_hi", "agreement_lo", "agreement_hi")},
        },
        orient="row",
    )
    return ok.join(ci, on="trial_id", how="left")


# the SmolLM2 shape: most points low and left, where the old legend sat, the knee among them
POINTS = [
    ("a", "saturation", 1.02, 0.96),
    ("b", "saturation", 1.10, 0.93),
    ("c", "saturation", 1.25, 0.91),
    ("d", "margin", 1.40, 0.30),
    ("e", "margin", 1.55, 0.12),
    ("f", "margin", 1.65, 0.06),
    ("g", "fixed", 2.40, 0.01),
    ("h", "fixed", 1.20, 0.05),
]


def pareto(intervals=None, points=POINTS):
    ok = trials(points, intervals or {})
    front = fronts(ok)
    knees = knees_table(front)
    return draw_pareto(ok, front, knees, "m", floor=0.05), knees.filter(pl.col("front") == "model").row(0, named=True)


def display(ax, xs, ys):
    return ax.transData.transform(list(zip(xs, ys)))


def test_the_pareto_legend_and_knee_label_hide_no_point_and_not_the_knee():
    fig, knee = pareto()
    fig.canvas.draw()
    ax = fig.axes[0]
    assert knee["trial_id"] is not None
    boxes = [ax.get_legend().get_window_extent()]
    boxes += [t.get_bbox_patch().get_window_extent() for t in ax.texts if t.get_text().startswith("knee:")]
    assert len(boxes) == 2  # the legend and the knee's label
    xs = [p[2] for p in POINTS] + [knee["speedup"], knee["knee_all_speedup"], 1.0]
    ys = [p[3] for p in POINTS] + [knee["agreement"], knee["knee_all_agreement"], 1.0]
    for box in boxes:
        for x, y in display(ax, xs, ys):
            assert not box.contains(x, y), (box, x, y)
        assert not box.overlaps(ax.get_window_extent())  # beside the axes, not on them


def test_one_wide_interval_does_not_set_the_speedup_axis_and_its_cut_end_is_written():
    wide = {t: (s * 0.9, s * 1.1, a * 0.9, min(1.0, a * 1.1)) for t, _, s, a in POINTS}
    wide["g"] = (1.05, 14.0, 0.0, 0.03)  # the 14x of the review
    fig, _ = pareto(wide)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert hi < 2.4 * 1.15 and lo > 0.8  # the points' range, padded
    assert "14.00x" in [t.get_text() for t in ax.texts]  # where the bar runs off
    for bars in ax.collections:  # every drawn bar ends inside the axis
        for segment in bars.get_segments():
            assert all(lo - 1e-9 <= x <= hi + 1e-9 for x, _ in segment)


def test_the_pareto_agreement_axis_fits_points_near_the_top():
    near = [(t, g, s, 0.97 + i * 0.004) for i, (t, g, s, _) in enumerate(POINTS)]
    fig, _ = pareto(points=near)
    lo, hi = fig.axes[0].get_ylim()
    assert 0.9 < lo < 0.97 and 1.0 < hi <= 1.03  # not 0-1 with every point in its top 3%


def test_the_pareto_figure_says_what_it_plots_and_hides_nothing_under_full_depth():
    """Full depth hollow and under the trials (a trial at 1x and agreement 1 shows); the front as steps (no
    setting between two front points); each front trial's own floor instead of a pooled band; the measured ratio
    beside a trial that ranks elsewhere; a tiny model's title says its weights are random."""
    points = [*POINTS, ("z", "saturation", 0.99, 1.0)]  # inside its floor: ranks 1x at agreement 1
    ok = trials(points, {}).with_columns(model_source=pl.lit("tiny"))
    front = fronts(ok)
    ax = draw_pareto(ok, front, knees_table(front), "m", floor=1.33).axes[0]
    (full,) = [c for c in ax.get_lines() if c.get_label().startswith("full depth")]
    trial_marks = [c for c in ax.get_lines() if "at its ranked speedup" in c.get_label()]
    assert full.get_markerfacecolor() == "none" and all(full.get_zorder() < c.get_zorder() for c in trial_marks)
    (steps,) = [c for c in ax.get_lines() if c.get_label().startswith("Pareto front")]
    assert steps.get_drawstyle() == "steps-pre"
    assert not ax.patches  # no pooled noise band (±133% here) drawn as if ranking used it
    floors = [c for c in ax.get_lines() if "own A/A noise floor" in c.get_label()]
    assert floors and list(floors[0].get_xdata()) == pytest.approx([1 / 1.05, 1.05])
    (measured,) = [c for c in ax.get_lines() if c.get_label().startswith("measured speedup_wall")]
    assert 0.99 in list(measured.get_xdata())
    assert "random weights" in ax.get_title() and "not used" not in ax.get_title()


def screen_rows(agreement: float) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "gate": ["saturation", "saturation", "margin"],
            "speedup_wall": [1.3, 1.6, 2.0],
            "agreement": [agreement, agreement / 2, 0.0],
            "speedup_model": [1.5, 1.9, 2.6],
            "agreement_tf": [agreement * 1.5, agreement, agreement / 3],
        }
    )


def test_the_screen_agreement_axis_is_not_0_1_when_every_point_is_near_0():
    fig = draw_screen(screen_rows(0.02))
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert hi < 0.1 and lo >= -0.03  # fitted: the points spread over the panel
    assert ax.get_xlim()[1] < 2.6 * 1.15
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())
    wide = draw_screen(screen_rows(0.6)).axes[0].get_ylim()  # spread over 0-1: the whole scale
    assert wide[0] <= 0.0 and wide[1] >= 0.9


def trace(margin: float = 1.5, rise: float = 0.5) -> pl.DataFrame:
    """Profile rows of one model of ``L`` layers, two positions: deltas that fall from 1 to 0.2, a top-1
    that matches from layer 20, margins from ``margin`` rising by ``rise``, similarities that rise with depth."""
    rows = []
    for layer, position in itertools.product(range(1, L + 1), (0, 1)):
        depth = layer / L
        rows.append(
            {
                "model": "m",
                "layer": layer,
                "num_layers": L,
                "position": position,
                "delta": 0.2 + 0.8 / layer + 0.01 * position,
                "pca_delta": 0.25 + 1.2 / layer,
                "top1_match": layer >= 20 + position,
                "margin": margin + rise * depth + 0.1 * position,
                "cos_hidden": depth**3,
                "cos_logits": depth,
                "topk_overlap": depth**2,
                "topk": 8,
            }
        )
    return pl.DataFrame(rows)


def assert_layer_axis(ax, last: int = L) -> None:
    ticks = ax.get_xticks()
    assert all(float(t).is_integer() for t in ticks)  # no layer 2.5
    assert ticks[0] == 1 and ticks[-1] <= last and all(1 <= t <= last for t in ticks)
    lo, hi = ax.get_xlim()
    assert 0 < lo < 1 and last < hi < last + 1  # from layer 1, not 0


def test_layer_ticks_are_integers_from_layer_1():
    assert layer_ticks(1, 30) == [1, 5, 10, 15, 20, 25, 30]
    assert layer_ticks(1, 4) == [1, 2, 3, 4]
    assert layer_ticks(1, 28) == [1, 5, 10, 15, 20, 25, 28]  # the last layer too, three past 25
    assert layer_ticks(1, 26)[-1] == 25 and layer_ticks(0, 12)[0] == 1
    for last in range(1, 200):
        ticks = layer_ticks(1, last)
        assert ticks[0] == 1 and ticks[-1] <= last and ticks == sorted(set(ticks)) and len(ticks) <= 12


@pytest.fixture
def layers():
    fig = draw_layers(layer_curve(trace(margin=1.0)), "m")
    fig.canvas.draw()
    return fig


def test_the_layers_figure_has_a_layer_axis_from_1_and_legends_above_the_panels(layers):
    for ax in layers.axes:
        assert_layer_axis(ax)
        assert ax.get_legend().get_window_extent().y0 >= ax.get_window_extent().y1 - 1
    top1 = layers.axes[1]  # the top-1 agreement spreads over 0-1 here: the whole scale
    assert top1.get_ylim()[0] <= 0.0 and top1.get_ylim()[1] >= 1.0


def test_the_eps_labels_do_not_overlap(layers):
    deltas = layers.axes[0]  # the eps lines fall near the deltas (0.2-1.5): drawn, their labels apart
    labels = [t for t in deltas.texts if t.get_text().startswith("eps")]
    assert [t.get_text() for t in labels] == [f"eps {v:g}" for v in EPS_LINES]
    boxes = [Text.get_window_extent(t) for t in labels]  # the text, not its leader line
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    for box in boxes:  # beside the panel, not over the curves
        assert box.x0 >= deltas.get_window_extent().x1


def test_threshold_lines_far_from_the_margins_do_not_set_the_panel(layers):
    margins = layers.axes[2]  # the margins (1-2 logits) fill the panel; theta 8, 14, 20 are named, not drawn
    lo, hi = margins.get_ylim()
    assert hi < min(THETA_LINES) and lo > 0.5
    assert [t.get_text() for t in margins.get_legend().get_texts()][
        -1
    ] == "theta 8, 14, 20: off the panel, above every value"
    assert not [t for t in margins.texts if t.get_text().startswith("theta")]


def test_the_margin_panel_draws_the_thresholds_its_data_reach():
    fig = draw_layers(layer_curve(trace(margin=6.0, rise=6.0)), "m")
    margins = fig.axes[2]
    assert [t.get_text() for t in margins.texts] == ["theta 8", "theta 14"]  # 20 would squash 6-12 into less than half
    assert margins.get_ylim()[0] < 8 and margins.get_ylim()[1] > 14
    assert margins.get_legend().get_texts()[-1].get_text() == "theta 20: off the panel, above every value"


def test_eas_panels_read_against_0_and_the_ceiling():
    alpha = 0.5
    per_layer = eas_per_layer(trace(), alpha)
    fig = draw_eas(per_layer, eas_table(trace(), alpha), alpha)
    ceiling = eas_ceiling(L, alpha)
    assert ceiling[0] == pytest.approx(((L - 1) / L) ** 0.5) and ceiling[-1] == 0.0
    for ax in fig.axes:
        assert ax.get_xlabel() == "relative depth l / L" and ax.get_xlim() == pytest.approx((0.0, 1.02))
        assert ax.get_ylim() == pytest.approx((-0.02, 1.02))  # the scale of A_l, the same in every report
        (model,) = [c for c in ax.get_lines() if "EAS" in c.get_label() and not c.get_label().startswith("ceiling")]
        assert list(model.get_xdata()) == pytest.approx([layer / L for layer in range(1, L + 1)])
        (line,) = [c for c in ax.get_lines() if c.get_label().startswith("ceiling")]
        assert list(line.get_ydata()) == pytest.approx(ceiling)
        assert f"EAS {sum(ceiling[:-1]) / (L - 1):.3f}" in line.get_label()
        assert any(list(c.get_ydata()) == [0.0, 0.0] for c in ax.get_lines())  # the 0 line
    title = fig._suptitle.get_text()
    assert "0: layer l's output shares nothing" in title and "the more early exit can save" in title


def test_the_lens_figure_has_a_layer_axis():
    layers = list(range(1, L + 1))
    curve = pl.DataFrame(
        {
            "layer": layers,
            "logit_top1": [min(1.0, max(0.0, (x - 20) / 10)) for x in layers],
            "tuned_top1": [x / L for x in layers],
            "kl_logit": [float(L - x) for x in layers],
            "kl_tuned": [0.5 * (L - x) for x in layers],
            "positions": [40] * L,
        }
    )
    fig = draw_lens(curve, "m", "r1")
    for ax in fig.axes:
        assert_layer_axis(ax)


def test_the_screen_pairs_points_by_number_and_bars_measured_ones_by_their_floor():
    rows = screen_rows(0.6).with_columns(speedup_floor=pl.Series([0.5, 0.1, None]))
    ax = draw_screen(rows).axes[0]
    assert not [c for c in ax.get_lines() if c.get_linestyle() == "-" and len(c.get_xdata()) == 2]  # no joins
    numbers = sorted(t.get_text() for t in ax.texts)
    assert numbers == ["1", "1", "2", "2", "3", "3"]
    spans = sorted(round(float(abs(seg[1][0] - seg[0][0])), 6) for c in ax.collections for seg in c.get_segments())
    assert [v for v in spans if v] == pytest.approx(sorted([2 * 1.3 * 0.5, 2 * 1.6 * 0.1]))  # none without a floor


def test_the_layer_panels_show_the_spread_not_only_the_median(layers):
    """A threshold under the median still fires on the steps below it: the delta and margin panels shade their
    10th-90th percentiles."""
    from matplotlib.collections import PolyCollection

    assert [any(isinstance(c, PolyCollection) for c in ax.collections) for ax in layers.axes] == [True, False, True]
