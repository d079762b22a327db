"""Small, dependency-free statistics for interleaved timings: medians, spread, paired ratio intervals."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# Two-sided 95% Student t quantiles by degrees of freedom; beyond the table the normal value is close enough.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("need at least two samples for an interval")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def spread(samples: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than 4 samples' worth of quartiles)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(samples)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float, float]:
    """Paired ratio numerator/denominator over rounds: (geometric mean, low, high) at 95%.

    Rounds are paired because they were interleaved: drift that slows one round slows both sides of it,
    so the per-round log ratios are far less noisy than the two series are.
    """
    n = min(len(numerator), len(denominator))
    logs = [math.log(a / b) for a, b in zip(numerator[:n], denominator[:n], strict=True)]
    center = statistics.fmean(logs)
    if n < 2:
        return math.exp(center), 0.0, math.inf
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return math.exp(center), math.exp(center - half), math.exp(center + half)


def drift(samples: Sequence[float]) -> float:
    """How unsteady a series that should be constant was: the larger of its IQR over median and the
    level shift between its first and second half (a job that started mid-calibration)."""
    if len(samples) < 4:
        return relative_range(samples)
    half = len(samples) // 2
    center = statistics.median(samples)
    shift = abs(statistics.median(samples[:half]) - statistics.median(samples[half:])) / center
    return max(spread(samples), shift)


def unpaired_ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float, float]:
    """Ratio of geometric means of two series timed in different rounds (Welch interval on the logs)."""
    a = [math.log(x) for x in numerator]
    b = [math.log(x) for x in denominator]
    center = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return math.exp(center), 0.0, math.inf
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return math.exp(center), math.exp(center), math.exp(center)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va and vb else min(len(a), len(b)) - 1
    half = t975(max(1, int(df))) * se
    return math.exp(center), math.exp(center - half), math.exp(center + half)


def relative_range(samples: Sequence[float]) -> float:
    """(max - min) / median: how far a series that should be constant drifted."""
    if len(samples) < 2:
        return 0.0
    return (max(samples) - min(samples)) / statistics.median(samples)


__all__ = ["drift", "median", "ratio_interval", "relative_range", "spread", "t975", "unpaired_ratio_interval"]
