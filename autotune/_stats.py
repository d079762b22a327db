"""Small, dependency-free statistics for interleaved timings: medians, spread, paired ratio intervals.

Every "clearly faster" claim is error-controlled here. Timing is sequential: the loop looks at the data at the
rounds in :data:`LOOKS` and may stop at any of them, so each look spends a share of the error budget
(Bonferroni over the looks, and, in ``looks.look``, over the pairs of one look): whatever the correlation
between looks, the chance that any look wrongly claims a gap beyond the margin is at most :data:`ALPHA` per
decision. A confidence sequence would allow a look every round, but its intervals are wider still at the 10-931
rounds a calibration can afford.

The estimand is a candidate's mean step time, tails included: what its training loop pays. The interval is
Student's t on the ratio of the means, paired by round because the rounds were interleaved: drift that slows a
round slows every candidate in it.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

#: overall one-sided error of a "clearly faster" claim, across all looks of one comparison
ALPHA = 0.05
#: the rounds at which the sequential test looks (and the only rounds at which timing may stop); a
#: sub-millisecond step's close call may need the last ones (a 6% gain on a busy machine's rounds: several
#: hundred), a slower step spends its budget long before
LOOKS: tuple[int, ...] = (3, 4, 5, 6, 8, 10, 12, 15, 18, 22, 26, 30, 36, 44, 54, 66, 81, 100, 122, 150, 183, 224,
                          275, 336, 412, 505, 619, 759, 931)
#: the one-sided error spent at each look: a pair is tested in at most one pruning stage and in the final
#: comparison (whose last look is also the test the decision repeats), each with at most ``len(LOOKS)`` looks;
#: a pruning stage stops at 10 rounds, so the shares of its later looks stay unspent, for the variants that
#: test the same question again
ALPHA_PER_LOOK = ALPHA / (2 * len(LOOKS))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
                          -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-12:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The t value with P(T <= t) = p, e.g. ``t_quantile(0.975, 10)`` = 2.228."""
    if df < 1:
        raise ValueError("need at least two samples for an interval")
    if not 0.5 <= p < 1.0:
        raise ValueError(f"p must be in [0.5, 1), not {p}")
    low, high = 0.0, 1.0
    while t_sf(high, df) > 1.0 - p:
        high *= 2.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        if t_sf(mid, df) > 1.0 - p:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def spread(samples: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than 2 samples)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(samples)


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, alpha: float = ALPHA_PER_LOOK
) -> tuple[float, float, float]:
    """Paired ratio of the mean step times numerator/denominator over the rounds both have: (estimate, low, high).

    The estimate is what a training loop pays, every step's time in it: a candidate's own stalls (an allocator
    returning memory every few steps, a periodic synchronisation) count. A tail both candidates show cancels in
    the pair and is left out (:func:`common_tails`): another program's hits on the machine are neither one's
    speed. The bounds are the ratio estimator's (the delta method): each round's residual, its numerator less the
    ratio times its denominator, is paired, so a disturbance that slowed both candidates of a round moves neither
    the estimate nor the residuals' spread much. Each bound has one-sided error ``alpha``; the default is one
    look's share of :data:`ALPHA`. One round gives ``(estimate, 0, inf)``.
    """
    n = min(len(numerator), len(denominator))
    out = common_tails([math.log(a / b) for a, b in zip(numerator[:n], denominator[:n], strict=True)])
    pairs = [(a, b) for i, (a, b) in enumerate(zip(numerator[:n], denominator[:n], strict=True)) if i not in out]
    mean = statistics.fmean(a for a, _ in pairs)
    ratio = mean / statistics.fmean(b for _, b in pairs)
    if len(pairs) < 2:
        return ratio, 0.0, math.inf
    residuals = [a - ratio * b for a, b in pairs]
    half = t_quantile(1.0 - alpha, len(pairs) - 1) * statistics.stdev(residuals) / mean / math.sqrt(len(pairs))
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


#: rounds from which outlying log ratios may be left out of an interval, and how far out (in robust deviations:
#: 1.4826 x the median absolute deviation, the standard deviation of normal data) a round must lie
TRIM_FROM = 10
TRIM_MADS = 5.0


def common_tails(logs: list[float]) -> set[int]:
    """The rounds whose log ratio lies beyond :data:`TRIM_MADS` robust deviations of the median, where both
    candidates show such a tail (some rounds beyond on each side) and a sign test cannot tell the two tails'
    rates apart at :data:`ALPHA`: a tail both saw is the machine's, not either one's speed. A tail on one side
    only, or clearly more of it on one side, is a candidate's own, and stays. From :data:`TRIM_FROM` rounds on;
    never more than a quarter of them."""
    if len(logs) < TRIM_FROM:
        return set()
    center = statistics.median(logs)
    deviation = 1.4826 * statistics.median(abs(x - center) for x in logs)
    if deviation == 0.0:
        return set()
    above = {i for i, x in enumerate(logs) if x - center > TRIM_MADS * deviation}
    below = {i for i, x in enumerate(logs) if center - x > TRIM_MADS * deviation}
    both = len(above) + len(below)
    if not above or not below or both > 0.25 * len(logs):
        return set()
    fewer = min(len(above), len(below))
    sign_p = min(1.0, 2 * sum(math.comb(both, k) for k in range(fewer + 1)) / 2**both)
    return above | below if sign_p >= ALPHA else set()


def paired_scores(series: Mapping[K, Sequence[float]]) -> dict[K, float]:
    """Each series' paired ratio to the longest one: the ratio of their means over the rounds the two share
    (:func:`ratio_interval`'s estimate). Every series is compared on its own rounds (round ``i`` is the same round
    in every series), never on a prefix cut to the shortest one."""
    anchor = max(series, key=lambda k: len(series[k]))
    reference = series[anchor]
    return {k: 1.0 if k == anchor or not one else statistics.fmean(one) / statistics.fmean(reference[:len(one)])
            for k, one in series.items()}


def level_shift(samples: Sequence[float]) -> tuple[float, float]:
    """How far the level of a series that should be constant moved, and how noisy the series is on its own, both
    over its median: the gap between the medians of its first and second half, and the robust standard deviation
    of one sample from its round-to-round differences (1.4826 x their median absolute deviation / sqrt 2), which
    neither one level shift nor a steady ramp moves. (0, 0) for fewer than 3 samples."""
    if len(samples) < 3:
        return 0.0, 0.0
    half = len(samples) // 2
    center = statistics.median(samples)
    shift = abs(statistics.median(samples[:half]) - statistics.median(samples[half:])) / center
    steps = [b - a for a, b in itertools.pairwise(samples)]
    typical = statistics.median(steps)
    return shift, 1.4826 * statistics.median(abs(d - typical) for d in steps) / math.sqrt(2) / center


def relative_range(samples: Sequence[float]) -> float:
    """(max - min) / median: how far a series that should be constant drifted."""
    if len(samples) < 2:
        return 0.0
    return (max(samples) - min(samples)) / statistics.median(samples)


__all__ = [
    "ALPHA", "ALPHA_PER_LOOK", "LOOKS", "TRIM_FROM", "TRIM_MADS", "common_tails", "level_shift", "median",
    "paired_scores", "ratio_interval", "relative_range", "spread", "t_quantile", "t_sf",
]
