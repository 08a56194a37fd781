"""The A/A noise floor, exactly: how far the bench's speedup estimator wanders when both sides are
full depth.

Every trial times full depth against full depth in its own rounds (the A/A control). Each round
gives one ratio (the round's units summed on both sides); the bench's estimator is the median over
rounds of those ratios (``sweep.bench.estimators.pooled_speedup``). Drawing ``n`` rounds with replacement
from the measured ones gives the null distribution of that estimator at ``n`` rounds; it is computed
here in closed form (order statistics of draws from the measured rounds, each equally likely), not
sampled, so the same timings always give the same floor and a probability near the level never
flips it. The floor f is its ``level`` quantile of |log|: a speedup within [1/(1+f), 1+f] cannot be
told from 1.0. Plain numpy.
"""

from __future__ import annotations

import math

import numpy as np

FLOOR_LEVEL = 0.95  # a null effect (full depth against itself) lands inside the floor at least this often
MAX_POOL = 1000  # a larger pool of rounds is summarised by this many of its quantiles (equal mass each)


def round_ratios(baseline, other) -> np.ndarray | None:
    """Per round: baseline time summed over its units / the other side's, from (rounds, units)
    timings; None when they are empty, of different shapes, or not positive and finite."""
    base, aa = (np.asarray(v, dtype=float) for v in (baseline, other))
    if base.ndim != 2 or base.size == 0 or aa.shape != base.shape:
        return None
    b, a = base.sum(axis=-1), aa.sum(axis=-1)
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(a)) and np.all(b > 0) and np.all(a > 0)):
        return None
    return b / a


def noise_floor(baseline, other, rounds: int | None = None, level: float = FLOOR_LEVEL) -> float | None:
    """The A/A noise floor f of an A/A control's timings (``baseline`` and ``other``: the two full-depth
    sides, (rounds, units), several controls' rounds may be stacked): the smallest f such that the
    median of ``rounds`` rounds drawn with replacement (default: as many as given) lies within
    [1/(1+f), 1+f] with probability at least ``level``. It covers the A/A's offset from 1.0 and its
    spread. None without timings."""
    ratios = round_ratios(baseline, other)
    if ratios is None:
        return None
    atoms, probs = median_distribution(_pool(ratios), rounds or len(ratios))
    dev = np.abs(np.log(atoms))
    order = np.argsort(dev, kind="stable")
    mass = np.cumsum(probs[order])
    at = min(int(np.searchsorted(mass, level - 1e-12)), len(order) - 1)
    return float(np.expm1(dev[order][at]))


def rounds_for_floor(
    baseline, other, target: float, rounds: int | None = None, level: float = FLOOR_LEVEL
) -> int | None:
    """The timed rounds a floor of ``target`` needs (0.02: speedups beyond +-2% can be told from 1.0),
    projected from the floor f at ``rounds`` rounds (default: as many as given) of these timings. The
    floor is an offset o (|log| of the A/A's median over every round: a bias, which more rounds do not
    average away) plus a spread s = log(1+f) - o, which shrinks as 1/sqrt(rounds):
    rounds * (s / (log(1+target) - o))^2, rounded up. None when o alone reaches the target, or
    without timings. (Drawing many rounds from a few measured ones cannot be trusted beyond them: the
    median of such draws sits on a lattice of the measured values, so the law is applied instead.)"""
    ratios = round_ratios(baseline, other)
    if ratios is None:
        return None
    n = rounds or len(ratios)
    offset = abs(float(np.log(np.median(ratios))))
    spread = max(float(np.log1p(noise_floor(baseline, other, rounds=n, level=level))) - offset, 0.0)
    room = float(np.log1p(target)) - offset
    if room <= 0:
        return None
    return max(1, math.ceil(n * (spread / room) ** 2 - 1e-9))


def _pool(ratios: np.ndarray) -> np.ndarray:
    """The rounds' ratios, sorted; a pool larger than ``MAX_POOL`` as that many of its quantiles."""
    pool = np.sort(ratios)
    if len(pool) <= MAX_POOL:
        return pool
    return pool[((np.arange(MAX_POOL) + 0.5) * len(pool) / MAX_POOL).astype(int)]


def median_distribution(values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact distribution of ``np.median`` of ``n`` draws with replacement from ``values`` (sorted,
    each equally likely): (atoms, probabilities). Odd ``n``: the median is the k-th order statistic,
    P(X_(k) <= v_j) = P(Bin(n, j/m) >= k). Even ``n``: the mean of the k-th and (k+1)-th, whose joint
    law is: both the a-th value, or exactly k draws at or below a (one at a), none strictly between a
    and b, and the rest at or above b (one at b)."""
    m = len(values)
    F = np.arange(m + 1) / m  # F[j]: probability a draw is one of the j smallest
    if n % 2:
        k = (n + 1) // 2
        tail = _binomial_tail(n, F, k)
        return values, np.diff(tail)
    k = n // 2
    same = _binomial_tail(n, F[1:], k + 1) - _binomial_tail(n, F[:-1], k)
    same += np.exp(_log_choose(n, k) + _xlogy(k, F[:-1]) + _xlogy(n - k, 1 - F[1:]))
    # a < b: C(n,k) (F_a^k - F_{a-1}^k) ((1-F_{b-1})^(n-k) - (1-F_b)^(n-k)), each difference as a factor of
    # its larger term, in logs (the terms alone under- or overflow at thousands of rounds)
    with np.errstate(divide="ignore", invalid="ignore"):
        low = _xlogy(k, F[1:]) + np.log(-np.expm1(_xlogy(k, F[:-1]) - _xlogy(k, F[1:])))  # index a - 1
        high = _xlogy(n - k, 1 - F[:-1]) + np.log(-np.expm1(_xlogy(n - k, 1 - F[1:]) - _xlogy(n - k, 1 - F[:-1])))
    a, b = np.triu_indices(m, k=1)
    pairs = np.exp(_log_choose(n, k) + low[a] + high[b])
    atoms = np.concatenate([values, (values[a] + values[b]) / 2])
    return atoms, np.concatenate([same, np.nan_to_num(pairs)])


def _xlogy(x, y) -> np.ndarray:
    """x * log(y), 0 where x is 0 (0^0 = 1), -inf where y is 0 and x is not."""
    y = np.asarray(y, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(x) == 0, 0.0, x * np.log(y))


def _log_choose(n: int, k) -> np.ndarray:
    lf = _log_factorials(n)
    k = np.asarray(k)
    return lf[n] - lf[k] - lf[n - k]


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])


def _binomial_tail(n: int, ps: np.ndarray, r: int) -> np.ndarray:
    """P(Bin(n, p) >= r) for each p in ``ps``, from the pmf in logs (in chunks of p)."""
    ps = np.asarray(ps, dtype=float)
    if r <= 0:
        return np.ones_like(ps)
    if r > n:
        return np.zeros_like(ps)
    j = np.arange(r, n + 1)
    logc = _log_choose(n, j)
    out = np.empty_like(ps)
    step = max(1, 2_000_000 // len(j))
    for s in range(0, len(ps), step):
        p = ps[s : s + step, None]
        out[s : s + step] = np.exp(logc + _xlogy(j, p) + _xlogy(n - j, 1 - p)).sum(axis=1)
    return np.clip(out, 0.0, 1.0)
