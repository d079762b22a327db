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
from collections.abc import Collection, Hashable, Mapping, Sequence
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
    numerator: Sequence[float], denominator: Sequence[float], *, alpha: float = ALPHA_PER_LOOK,
    left_out: Collection[int] | None = None,
) -> tuple[float, float, float]:
    """Paired ratio of the mean step times numerator/denominator over the rounds both have: (estimate, low, high).

    The estimate is what a training loop pays, every step's time in it: a candidate's own stalls (an allocator
    returning memory every few steps, a periodic synchronisation) count. Rounds a disturbance of the machine
    slowed are neither one's speed and are left out: ``left_out`` (:func:`left_out`, judged over every candidate
    of a comparison), else as the pair alone shows them (:func:`machine_tails`). The bounds are the ratio
    estimator's (the delta method): each round's residual, its numerator less the ratio times its denominator,
    is paired, so a disturbance that slowed both candidates of a round moves neither the estimate nor the
    residuals' spread much. Each bound has one-sided error ``alpha``; the default is one look's share of
    :data:`ALPHA`. One round gives ``(estimate, 0, inf)``.
    """
    n = min(len(numerator), len(denominator))
    out = left_out if left_out is not None else pair_left_out(numerator, denominator)
    pairs = [(a, b) for i, (a, b) in enumerate(zip(numerator[:n], denominator[:n], strict=True)) if i not in out]
    mean = statistics.fmean(a for a, _ in pairs)
    ratio = mean / statistics.fmean(b for _, b in pairs)
    if len(pairs) < 2:
        return ratio, 0.0, math.inf
    residuals = [a - ratio * b for a, b in pairs]
    half = t_quantile(1.0 - alpha, len(pairs) - 1) * statistics.stdev(residuals) / mean / math.sqrt(len(pairs))
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


#: rounds from which slow rounds may be left out of an interval, and how far out (in robust deviations:
#: 1.4826 x the median absolute deviation, the standard deviation of normal data) a round's log ratio must lie,
#: and at least how much slower than the pair's median (less is noise, where rounds agree closely: never the
#: machine's, so a tail as small cannot make another candidate's own stalls look like the machine's)
TRIM_FROM = 10
TRIM_MADS = 5.0
TRIM_FLOOR = 0.20

#: each series' rounds a disturbance of the machine slowed, or None where its slow rounds are its own
Tails = Mapping[K, frozenset[int] | None]


def machine_tails(series: Mapping[K, Sequence[float]]) -> dict[K, frozenset[int] | None]:
    """Each series' slow rounds that the machine's disturbances explain (to be left out of its pairs), or None
    where they are its own (they stay: its training loop pays them).

    A round is slow for a series against another where its log ratio to the other's same round lies beyond
    :data:`TRIM_MADS` robust deviations above that pair's median, once they share :data:`TRIM_FROM` rounds (a
    drift, or a burst that slowed both, cancels in a pair). The machine's disturbances hit every candidate alike,
    so a series' slow rounds are the machine's where others show some too and its rate of rounds slow against
    every other is not clearly above (one-sided, at :data:`ALPHA` over the others) any other's: pooled over every
    series of a comparison, not one pair. Then every round slow against any other is left out (a disturbance
    that slowed two candidates of a round is not slow in their pair, but is against a third). A stall of its own,
    in its rounds at a steady rate while the others' are clean, stays."""
    # Each round's verdicts against each other series that has it: slow against every one of them counts towards
    # its rate (a round where another was unusually fast is not this one's); slow against any one is left out.
    votes: dict[K, dict[int, bool]] = {}
    against_any: dict[K, set[int]] = {}
    for a, b in itertools.permutations(series, 2):
        n = min(len(series[a]), len(series[b]))
        if n < TRIM_FROM:
            continue
        logs = [math.log(x / y) for x, y in zip(series[a][:n], series[b][:n], strict=True)]
        center = statistics.median(logs)
        deviation = 1.4826 * statistics.median(abs(x - center) for x in logs)
        mine, any_one = votes.setdefault(a, {}), against_any.setdefault(a, set())
        for i, x in enumerate(logs):
            slow_here = deviation > 0 and x - center > max(TRIM_MADS * deviation, math.log1p(TRIM_FLOOR))
            mine[i] = mine.get(i, True) and slow_here
            if slow_here:
                any_one.add(i)
    slow = {key: {i for i, is_slow in each.items() if is_slow} for key, each in votes.items()}
    found: dict[K, frozenset[int] | None] = {key: frozenset(against_any.get(key, ())) for key in series}
    for key, rounds in slow.items():
        others = [other for other in slow if other != key]
        if rounds and (not any(slow[other] for other in others) or any(
                _rate_above(len(rounds), len(series[key]), len(slow[other]), len(series[other])) < ALPHA / len(others)
                for other in others)):
            found[key] = None
    return found


def _rate_above(hits: int, rounds: int, other_hits: int, other_rounds: int) -> float:
    """One-sided p-value of "a rate of ``hits`` in ``rounds`` is above ``other_hits`` in ``other_rounds``": the
    hits given their total, binomial at the share of the rounds (the conditional test of two Poisson rates)."""
    total, share = hits + other_hits, rounds / (rounds + other_rounds)
    return sum(math.comb(total, k) * share**k * (1 - share) ** (total - k) for k in range(hits, total + 1))


def left_out(tails: Tails[K], a: K, b: K, rounds: int) -> frozenset[int]:
    """The rounds of the pair ``a``, ``b`` (``rounds`` shared) a disturbance of the machine slowed: none where
    either one's slow rounds are its own (both keep the machine's, which then cancel in the ratio) or where they
    would leave fewer than half the rounds (the machine's disturbances are the exception)."""
    mine, theirs = tails.get(a), tails.get(b)
    if mine is None or theirs is None:
        return frozenset()
    out = frozenset(i for i in mine | theirs if i < rounds)
    return out if 2 * len(out) <= rounds else frozenset()


def pair_left_out(numerator: Sequence[float], denominator: Sequence[float]) -> frozenset[int]:
    """:func:`left_out` as the pair alone shows it."""
    n = min(len(numerator), len(denominator))
    return left_out(machine_tails({0: numerator[:n], 1: denominator[:n]}), 0, 1, n)


def paired_scores(series: Mapping[K, Sequence[float]], tails: Tails[K] | None = None) -> dict[K, float]:
    """Each series' paired ratio to the longest one: the ratio of their means over the rounds the two share
    (:func:`ratio_interval`'s estimate), less those the machine's disturbances slowed (``tails``, default
    :func:`machine_tails` of ``series``). Every series is compared on its own rounds (round ``i`` is the same
    round in every series), never on a prefix cut to the shortest one."""
    tails = machine_tails(series) if tails is None else tails
    anchor = max(series, key=lambda k: len(series[k]))
    reference = series[anchor]

    def score(key: K) -> float:
        one = series[key]
        out = left_out(tails, key, anchor, len(one))
        kept = [i for i in range(len(one)) if i not in out]
        return statistics.fmean(one[i] for i in kept) / statistics.fmean(reference[i] for i in kept)

    return {k: 1.0 if k == anchor or not one else score(k) for k, one in series.items()}


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
    "ALPHA", "ALPHA_PER_LOOK", "LOOKS", "TRIM_FLOOR", "TRIM_FROM", "TRIM_MADS", "Tails", "left_out", "level_shift",
    "machine_tails", "median", "pair_left_out", "paired_scores", "ratio_interval", "relative_range", "spread",
    "t_quantile", "t_sf",
]
