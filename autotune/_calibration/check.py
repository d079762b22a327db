"""The canary, in the worker: a family's cached pick re-timed against fp32 and the runner-up.

Far cheaper than a calibration: no search, no numerics gate (the candidates passed it when calibrated), only
the candidates named, set up once (their unchecked first steps warm them up) and timed in a few interleaved,
paired rounds with the calibration's own :func:`~autotune._calibration.measure.interleave`. Whether the pick
is still within the margin of the best is the host's decision (``autotune._canary``).
"""

from __future__ import annotations

from collections.abc import Callable

from autotune import _rules, _stats
from autotune._calibration.measure import Clock, Comparisons, Steppable, interleave, warm_up
from autotune._calibration.protocol import Begin, Checked, CheckJob, Failed, Retimed
from autotune._calibration.setup import CandidateFailed, Prepared, TorchLab, classify
from autotune._families import Family
from autotune._models import Candidate, CandidateResult


def check(job: CheckJob, emit: Callable[[Begin | Failed | Checked], None], *, clock: Clock, control: Steppable,
          settle: Callable[[float], None]) -> None:
    """Set up each candidate, time them together, emit one :class:`Checked` (failures as :class:`Failed`)."""
    lab = TorchLab(Family(job.family.name, job.family.ref), job.settings)
    ready: dict[Candidate, Prepared] = {}
    for index, candidate in enumerate(job.candidates):
        emit(Begin(candidate=candidate, phase="setup", fraction=0.5 * index / len(job.candidates)))
        try:
            ready[candidate] = lab.set_up(candidate)
        except CandidateFailed as exc:
            emit(Failed(result=exc.result))
        except Exception as exc:  # recorded with its class, never swallowed: the host recalibrates
            emit(Failed(result=CandidateResult(candidate=candidate, failure=classify(exc, candidate.device))))
    settings = job.settings.measure
    estimates = {c: _stats.median(warm_up(p.step, clock, p.recent_s, settings)[-3:]) for c, p in ready.items()}
    timed = interleave(
        {c: p.step for c, p in ready.items()}, estimate_s=estimates, control=control, clock=clock,
        settings=settings, settle=settle,
        on_round=lambda rounds, key: emit(Begin(candidate=key, phase="timing", fraction=0.5 + 0.5 * min(
            1.0, rounds / settings.max_rounds))) if key is not None else None,
        comparisons=Comparisons(group=lambda c: "check", margin=_rules.margin),
    )
    emit(Checked(series=[Retimed(candidate=c, round_ms=s.round_ms) for c, s in timed.series.items()],
                 noisy=timed.noisy))


__all__ = ["check"]
