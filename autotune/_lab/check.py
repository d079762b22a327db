"""The canary, in the worker: a family's cached pick re-timed against fp32 and the runner-up.

Far cheaper than a calibration: no search, no numerics gate (the candidates passed it when calibrated), only
the candidates named, set up once (their unchecked first steps warm them up) and timed in a few interleaved,
paired rounds with the calibration's own :func:`~autotune._lab.measure.interleave`, until
:func:`faster_by_margin` can answer for every other candidate. The verdict is the host's (``autotune._tools.check``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from autotune import _rules, _stats
from autotune._lab.measure import Clock, Comparisons, K, Runnable, Series, Watch, interleave, warm_up
from autotune._lab.prepare import CandidateFailed, Prepared, TorchLab, classify
from autotune._lab.protocol import Begin, Checked, CheckJob, Failed, Retimed
from autotune._records import Candidate, CandidateResult


def faster_by_margin(other_ms: Sequence[float], pick_ms: Sequence[float]) -> bool | None:
    """Is the other candidate faster than the pick by more than :data:`~autotune._rules.MARGIN`, at the
    decision's confidence? None while the paired rounds cannot tell.

    One margin for every pair, variants of the pick's own math included: a smaller gain is not worth a
    calibration, and a near-tie is answered (no) as soon as the other cannot be that much faster.
    """
    _, low, high = _stats.ratio_interval(other_ms, pick_ms)
    if high * (1 + _rules.MARGIN) < 1:
        return True
    if low * (1 + _rules.MARGIN) >= 1:
        return False
    return None


def answered(pick: K) -> Callable[[Mapping[K, Series[K]]], bool]:
    """The canary's stopping rule: at a look, stop once every other candidate is answered, or one is faster."""

    def rule(series: Mapping[K, Series[K]]) -> bool:
        answers = [faster_by_margin(s.round_ms, series[pick].round_ms) for c, s in series.items() if c != pick]
        return True in answers or None not in answers

    return rule


def comparisons(pick: Candidate) -> Comparisons[Candidate]:
    """The canary's pairs: every candidate in one group, with the one margin of :func:`faster_by_margin`, and a
    tie goes to the pick, so a candidate ahead of it is timed until it is clearly within the margin of the pick
    or clearly beyond it (not merely until the pick cannot be faster than it: the question reversed; nor until
    the pick is clearly slower at all, as a calibration's pairs of the same math, a thread count, are settled)."""
    return Comparisons(group=lambda c: "check", margin=lambda a, b: _rules.MARGIN, indifference=lambda a, b: 0.0,
                       tie_winner=lambda a, b: pick if pick in (a, b) else None)


def check(job: CheckJob, emit: Callable[[Begin | Failed | Checked], None], *, clock: Clock, control: Runnable,
          settle: Callable[[float], None], watch: Watch) -> None:
    """Set up each candidate, time them together, emit one :class:`Checked` (failures as :class:`Failed`)."""
    lab = TorchLab(job.family, job.settings, probe=False)
    ready: dict[Candidate, Prepared] = {}
    for index, candidate in enumerate(job.candidates):
        emit(Begin(candidate=candidate, phase="setup", fraction=0.5 * index / len(job.candidates)))
        try:
            ready[candidate] = lab.set_up(candidate)
        except CandidateFailed as exc:
            emit(Failed(result=exc.result))
        except Exception as exc:  # recorded with its class, never swallowed: the host recalibrates
            emit(Failed(result=CandidateResult(candidate=candidate, failure=classify(exc, candidate.device))))
    if job.pick not in ready:
        emit(Checked(series=[], noisy=False))  # the pick failed: that is the verdict, no rounds needed
        return
    settings = job.settings.measure
    estimates = {c: _stats.median(warm_up(p.step, clock, p.recent_s, settings)[-3:]) for c, p in ready.items()}
    timed = interleave(
        {c: p.step for c, p in ready.items()}, estimate_s=estimates, control=control, clock=clock,
        settings=settings, settle=settle,
        on_round=lambda rounds, key: emit(Begin(candidate=key, phase="timing", fraction=0.5 + 0.5 * min(
            1.0, rounds / settings.max_rounds))) if key is not None else None,
        comparisons=comparisons(job.pick), answered=answered(job.pick), watch=watch,
    )
    emit(Checked(series=[Retimed(candidate=c, round_ms=s.round_ms) for c, s in timed.series.items()],
                 noisy=timed.noisy))


__all__ = ["answered", "check", "comparisons", "faster_by_margin"]
