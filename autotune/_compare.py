"""Comparing candidates on their final timings: step medians over shared rounds, paired ratio intervals, and
"clearly faster" by the pair's margin at the decision's confidence (or, for a short job, on set-up + steps)."""

from __future__ import annotations

from collections.abc import Sequence

from autotune import _stats
from autotune._models import CandidateResult
from autotune._rules import margin


def is_cpu(result: CandidateResult) -> bool:
    return result.candidate.device == "cpu"


def step_ms(result: CandidateResult) -> float:
    assert result.timing is not None
    return result.timing.median_ms


def score_ms(result: CandidateResult, expected_steps: int | None, median_ms: float | None = None) -> float:
    """Step time (``median_ms``, else the timing's median), or set-up + ``expected_steps`` steps for a short job."""
    median_ms = step_ms(result) if median_ms is None else median_ms
    if expected_steps is None:
        return median_ms
    return 1000 * (result.setup_s or 0.0) + expected_steps * median_ms


def ranking(results: Sequence[CandidateResult], expected_steps: int | None) -> dict[int, float]:
    """Each result's score (by ``id``) for ranking ``results`` against one another: step medians over the final
    rounds they all share (round ``i`` is the same round in every series of the final comparison), so one
    settled early is not compared over its early rounds with another's later, drifted ones; a timing from an
    earlier stage (a device outpaced there) by its own median."""
    final = [r.timing for r in results if r.timing is not None and r.timing.final]
    shared = min((timing.n for timing in final), default=0)
    return {id(r): score_ms(r, expected_steps, _stats.median(r.timing.round_ms[:shared])
                             if len(final) > 1 and r.timing is not None and r.timing.final else None)
            for r in results}


def step_ratio(a: CandidateResult, b: CandidateResult) -> tuple[float, float, float]:
    """Step-time ratio a/b with its interval, paired over the rounds both were timed in (the final ones).

    When ``a`` was outpaced by ``b``'s device, its evidence stands in; timings never paired give no
    confidence at all: ``(estimate, 0, inf)``.
    """
    assert a.timing is not None and b.timing is not None
    for slow, fast, sign in ((a, b, 1), (b, a, -1)):
        outpaced = slow.timing.outpaced if slow.timing is not None else None
        if outpaced is not None and outpaced.by.device == fast.candidate.device:
            ratio = outpaced.ratio  # a resolved verdict of the timing: stronger than a short paired prefix
            return (ratio.estimate, ratio.low, ratio.high) if sign == 1 else (
                1 / ratio.estimate, 1 / ratio.high, 1 / ratio.low if ratio.low > 0 else float("inf"))
    if a.timing.stage == b.timing.stage and min(a.timing.n, b.timing.n) >= 2:
        return _stats.ratio_interval(a.timing.round_ms, b.timing.round_ms)
    return step_ms(a) / step_ms(b), 0.0, float("inf")


def clearly_faster(fast: CandidateResult, slow: CandidateResult, expected_steps: int | None) -> bool:
    """True when ``fast`` beats ``slow`` by more than their margin, at the decision's confidence.

    For a short job the score is set-up + steps x step time; the step time's bound comes from the paired
    interval, the set-up times are single measurements.
    """
    _, _, high = step_ratio(fast, slow)
    if high == float("inf"):
        return False
    if expected_steps is None:
        return high * (1 + margin(fast.candidate, slow.candidate)) < 1
    slow_ms = step_ms(slow)
    fast_high_ms = 1000 * (fast.setup_s or 0.0) + expected_steps * slow_ms * high
    return fast_high_ms * (1 + margin(fast.candidate, slow.candidate)) < score_ms(slow, expected_steps)


__all__ = ["clearly_faster", "is_cpu", "ranking", "score_ms", "step_ms", "step_ratio"]
