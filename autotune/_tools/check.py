"""``python -m autotune --check``: is each cached pick still the fastest? A few paired rounds, not a calibration.

The fingerprint cannot see everything that changes speed: a driver update that kept its version string,
thermal paste drying out, a background service. For each measured family the cached pick is re-timed in the
worker against fp32 on the CPU and the runner-up (the fastest other candidate of the final comparison, dropped
or not, on another device, precision or thread count), in interleaved rounds; when another of them is now
faster than the pick by more than the decision margin (at the decision's confidence; see
:func:`~autotune._lab.check.faster_by_margin`), or the pick fails, the family is calibrated again and
the change reported. The rounds stop as soon as that question is answered for every candidate.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from autotune import _env, _stats
from autotune._answer import cached_families
from autotune._apply import fp32 as _fp32
from autotune._cache.locks import measuring
from autotune._calibrate import new_worker, run_calibration
from autotune._decide import finalists, picked
from autotune._families import Family, family_names, get_family
from autotune._lab.check import faster_by_margin
from autotune._lab.measure import MeasureSettings
from autotune._lab.plan import BASELINE
from autotune._lab.protocol import CalibrationSettings, CheckJob, Retimed
from autotune._records import Candidate, CandidateResult, FamilyResult, Record

log = logging.getLogger("autotune")

#: the canary's share of a calibration's timing budget, and its most rounds (a look of the sequential test)
BUDGET_SHARE = 0.1
MAX_ROUNDS = 6


class CheckResult(Record):
    """One family's canary: ``verdict`` ``ok`` (the pick holds) or ``recalibrated`` (``detail`` says why)."""

    model_kind: str
    pick: str
    against: list[str]
    verdict: Literal["ok", "recalibrated"]
    detail: str
    new_pick: str | None = None
    wall_s: float


def _moves_apart(candidate: Candidate, pick: Candidate) -> bool:
    return (candidate.device, candidate.precision, candidate.num_threads) != (pick.device, pick.precision,
                                                                            pick.num_threads)


def _against(measured: FamilyResult, pick: Candidate) -> list[Candidate]:
    # The runner-up comes from another device, precision or thread count: what can change unseen (a driver that
    # kept its version, cooling, a background service) shifts those against one another. A layout or
    # optimizer-kernel variant of the pick's own math runs on the same hardware and moves with the pick. One
    # dropped in the final comparison counts: a pick of fewer CPU threads won by dropping torch's own count,
    # and a machine that was busy then (a sibling core taken) is what the canary is for.
    timed = [r for r in measured.candidates if r.usable and r.timing is not None and r.timing.final]
    compared = {r.candidate: r for r in [*finalists(measured), *timed]}
    others = sorted((r for c, r in compared.items() if _moves_apart(c, pick)),
                    key=lambda r: r.timing.median_ms if r.timing is not None else float("inf"))
    chosen = [BASELINE] if pick != BASELINE else []
    if others and others[0].candidate not in chosen:
        chosen.append(others[0].candidate)
    return chosen


def check(measured: dict[Family, FamilyResult]) -> list[CheckResult]:
    """Re-time each family's pick in one worker; returns a verdict per family (nothing is recalibrated here)."""
    # Every candidate is timed in every round: one round far behind is interference here, not evidence
    # (a finite "never", as the settings cross the process boundary as JSON).
    never = 1e9
    # Nothing is verified, so set-up needs no verification window: the first step and one steady step, then
    # ``warm_up`` runs steps until three agree.
    settings = CalibrationSettings(verify=False, verify_steps=2, variant_verify_steps=2, measure=MeasureSettings(
        budget_s=BUDGET_SHARE * _env.BUDGET_S.get(), max_rounds=MAX_ROUNDS, far_behind=never,
        far_behind_device=never))
    results = []
    with new_worker() as worker, measuring():
        for family, record in measured.items():
            started = time.perf_counter()
            pick = picked(record)
            against = _against(record, pick)
            job = CheckJob(family=family, candidates=[*against[:1], pick,
                           *against[1:]], pick=pick, settings=settings, fp32=_fp32.current(),
                           sys_path=[p for p in sys.path if p])
            checked, failed, ended = worker.run_check(job)
            verdict, detail = _judge(pick, against, checked.series if checked is not None else None, failed,
                                     ended.detail if ended is not None else None)
            log.info("check %s: %s (%s)", family.name, verdict, detail)
            results.append(CheckResult(model_kind=family.name, pick=pick.label, against=[c.label for c in against],
                                       verdict=verdict, detail=detail, wall_s=time.perf_counter() - started))
    return results


def _judge(pick: Candidate, against: Sequence[Candidate], series: Sequence[object] | None,
           failed: Sequence[CandidateResult], ended: str | None) -> tuple[Literal["ok", "recalibrated"], str]:
    broken = next((r for r in failed if r.candidate == pick), None)
    if broken is not None and broken.failure is not None:
        return "recalibrated", f"the pick failed: {broken.failure.kind}: {broken.failure.detail}"
    if series is None:
        return "recalibrated", f"the check could not run: {ended or 'the worker stopped without a result'}"
    retimed = {s.candidate: s.round_ms for s in series if isinstance(s, Retimed)}
    mine = retimed.get(pick)
    if mine is None:
        return "recalibrated", "the pick was not timed"
    words = []
    for other in against:
        theirs = retimed.get(other)
        if theirs is None:
            continue
        estimate, low, high = _stats.ratio_interval(theirs, mine)
        if faster_by_margin(theirs, mine):
            return "recalibrated", (f"{other.label} is now faster than the pick ({pick.label}): its time over the "
                                    f"pick's {estimate:.2f}x, interval {low:.2f}-{high:.2f}")
        words.append(f"{other.label} {estimate:.2f}x the pick's time")
    rounds = len(mine)
    return "ok", f"{pick.label} still within the margin ({'; '.join(words) or 'nothing to compare'}; {rounds} rounds)"


def check_cached(model_kinds: Iterable[str] | None = None) -> list[CheckResult]:
    """The canary: re-time each measured family's pick (default: every registered kind measured here) against
    fp32 and the runner-up; a family whose pick is no longer within the margin is calibrated again."""
    known = set(family_names())
    measured = {get_family(k): r for k, r in cached_families(model_kinds, fresh_only=True).items()
                if k in known and r.origin is None}
    results = check(measured)
    stale = {r.model_kind for r in results if r.verdict == "recalibrated"}
    if not stale:
        return results
    again = run_calibration([family for family in measured if family.name in stale], force=True).measurements
    return [r.model_copy(update={"new_pick": picked(again[r.model_kind]).label})
            if r.model_kind in again else r for r in results]


__all__ = ["BUDGET_SHARE", "CheckResult", "check", "check_cached"]
