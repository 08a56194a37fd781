"""What every report figure shares: matplotlib without a display, saving, axes fitted to the data, layer
axes from 1, legends beside the plot."""

from __future__ import annotations

import math
from pathlib import Path

HEADLINE_TARGET = 0.98


def headline_target(targets) -> float:
    """The agreement the verdicts and the Pareto figures' line are at: 0.98 where ``analysis.targets`` holds it,
    else the nearest of them (the higher of two as near), so a verdict reads a row the targets table shows."""
    given = [float(t) for t in targets]
    return min(given, key=lambda t: (round(abs(t - HEADLINE_TARGET), 9), -t)) if given else HEADLINE_TARGET


def _figure(*grid: int, figsize: tuple[float, float], **kwargs):
    """A figure on an Agg canvas and its axes (``Figure.subplots``), without pyplot: no global registry of
    figures to close, no backend to switch, and pyplot's import is not paid on every `sweep analyze`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(*grid, **kwargs)


def _save(fig, out: Path, name: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    # zlib's fastest level: a little larger files, encoded faster (benchmarks/RESULTS.md, analyze over 10,000 files)
    fig.savefig(out / name, dpi=DPI, pil_kwargs={"compress_level": 1})
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
