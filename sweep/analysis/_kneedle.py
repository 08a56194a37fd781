"""The Kneedle knee (Satopää, Albrecht, Irwin and Raghavan, 2011) of a concave, decreasing curve.

Offline detection with sensitivity S and no smoothing: the results of the ``kneed`` package's
``KneeLocator(x, y, curve="concave", direction="decreasing")``, in numpy alone. Importing kneed
loads scipy.signal, which takes longer than the rest of `sweep analyze` over 10,000 trials.
A test checks that the two find the same knee on thousands of fronts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def kneedle(xs: Sequence[float], ys: Sequence[float], sensitivity: float = 1.0) -> float | None:
    """The x of the first knee of the points (``xs`` in increasing order), or None when there is none.

    Both axes are min-max normalised and mirrored so that the curve rises to its knee; the
    difference curve ``d`` (mirrored y less mirrored x) is walked from its first local maximum:
    each local maximum sets the threshold ``d_max - S * mean x step``, a local minimum clears it,
    and the first point after a maximum that drops below the threshold marks that maximum as the knee.
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    span_x, span_y = x.max() - x.min(), y.max() - y.min()
    if not span_x > 0 or not span_y > 0:  # a flat axis has no bend (and no normalisation)
        return None
    rising = np.flip(1.0 - (x - x.min()) / span_x)
    d = np.flip((y - y.min()) / span_y) - rising
    before, after = np.concatenate((d[:1], d[:-1])), np.concatenate((d[1:], d[-1:]))  # the ends meet themselves
    maxima, minima = (d >= before) & (d >= after), (d <= before) & (d <= after)
    if not maxima.any():
        return None
    step = abs(np.diff(rising).mean())
    threshold, at, active = 0.0, 0, True
    for i in range(int(np.argmax(maxima)), len(d) - 1):
        if maxima[i]:
            threshold, at, active = d[i] - sensitivity * step, i, True
        if minima[i]:  # a flat stretch is both: it clears what it set
            threshold, active = 0.0, False
        if active and d[i + 1] < threshold:
            return float(x[len(x) - 1 - at])
    return None
