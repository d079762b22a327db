"""From raw measurements to one Decision and its evidence (every other candidate against the pick, as data);
``_wording`` words its reason from that evidence. Pure: no device is touched here.

Rules, in order:
1. Only candidates that were timed and passed the numerics gate can be picked, and only those timed in the
   final paired comparison (a candidate dropped earlier is clearly slower, with its evidence, and never wins).
2. The user's preference selects the pool: ``auto`` everything, ``cpu`` the CPU, ``gpu`` any accelerator
   whatever its backend, a backend's name (``cuda``, ``mps``, ``xpu``) that backend's; with no usable one the CPU
   answers and the reason and a WARNING say so.
3. The fastest wins on step time (ranked on paired estimates: ``ranking``), or on set-up + ``expected_steps``
   x step time for a short job.
4. It must beat a preferred candidate on its device (fp32 < tf32 < bf16 < fp16, torch's thread count, eager:
   ``_rules.preference``) by more than ``_rules.margin`` with the decision's confidence
   (``_stats.ratio_interval``, paired over the final rounds, its error split over the k - 1 pairs of any one
   finalist: ``decision_alpha``); otherwise it is a tie and the preferred one wins. Layout and optimizer
   kernels (the same math) go to the faster. A pair the pick rests on that the rounds left open (the pick may
   be further from the best than the pair allows) is named in the evidence (``open_pairs``).
5. Another device must beat the CPU the same way, by ``_rules.MARGIN``; on a tie the CPU wins (no driver, no
   device memory held, no copies) and the reason says the GPU was no faster.
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Callable, Sequence

from autotune import _stats
from autotune._decision import Decision
from autotune._errors import CalibrationError
from autotune._records import (
    FP32_CPU,
    Candidate,
    CandidateResult,
    Evidence,
    FamilyResult,
    Interval,
    Prefer,
    Rival,
    Role,
    Verdict,
)
from autotune._rules import indifference, is_open, margin, tie_winner
from autotune._variants import CPU, FP32, PREFERENCES
from autotune._wording import headline, no_gpu_words, reason, times_over

log = logging.getLogger("autotune")


def finalists(measured: FamilyResult) -> list[CandidateResult]:
    """The candidates a decision may pick: usable, never dropped, and timed in the final paired comparison
    (or outpaced by another device: still their own device's answer)."""
    return [r for r in measured.candidates if r.usable and r.timing is not None and r.timing.dropped is None
            and (r.timing.final or r.timing.outpaced is not None)]


def decide(
    measured: FamilyResult,
    *,
    prefer: Prefer = "auto",
    expected_steps: int | None = None,
    forced_device: str | None = None,
    digest: str,
) -> Decision:
    """The Decision for ``measured.model_kind``; raises CalibrationError when nothing can train it."""
    usable = finalists(measured)
    if not usable:
        raise _untrainable(measured)
    no_gpu = None
    if forced_device is not None:
        pool = [r for r in usable if r.candidate.device == forced_device]
        if not pool:
            return _unmeasured_forced(measured, forced_device, digest)
    elif prefer == CPU:
        pool = [r for r in usable if is_cpu(r)]
    elif prefer != "auto":
        pool = [r for r in usable if not is_cpu(r) and prefer in ("gpu", r.candidate.device.split(":")[0])]
        if not pool:
            pool = [r for r in usable if is_cpu(r)]
            no_gpu = no_gpu_words(measured)
            log.warning("%s: GPU requested but %s; training on the CPU", measured.model_kind, no_gpu)
    else:
        pool = usable

    alpha = decision_alpha(measured.candidates)
    pick = pick_fastest(pool, expected_steps, alpha=alpha)
    numerics = pick.numerics
    evidence = Evidence(
        device_name=pick.device_name,
        rivals=[rival(pick, other, expected_steps, alpha=alpha) for other in measured.candidates if other is not pick],
        prefer=prefer, expected_steps=expected_steps, forced=forced_device, no_gpu=no_gpu,
        default_scale_skipped=numerics.default_scale_skipped if numerics is not None else None,
        verified_steps=len(numerics.losses) if numerics is not None else None,
        noisy=measured.noisy, noisy_because=measured.noisy_because, loads=measured.loads,
        control_shift=measured.control_shift, after_noisy=measured.after_noisy, origin=measured.origin,
        unresolved=open_pairs(pick, pool, expected_steps, alpha=alpha),
    )
    baseline = next((r for r in measured.candidates if r.usable and r.candidate == FP32_CPU), None)
    config = Decision(
        **pick.candidate.model_dump(),
        model_kind=measured.model_kind,
        source="forced" if forced_device is not None else "measured",
        reason=reason(pick.candidate, evidence, measured_at=measured.measured_at),
        evidence=evidence,
        step_ms=step_ms(pick),
        setup_s=pick.setup_s,
        speedup_vs_fp32_cpu=_speedup(pick, baseline, evidence) if baseline else None,
        init_scale=numerics.init_scale if numerics else None,
        peak_memory_mb=pick.peak_bytes / 2**20 if pick.peak_bytes is not None else None,
        noisy=measured.noisy,
        fingerprint_digest=digest,
        measured_at=measured.measured_at,
    )
    log.info("%s: %s", measured.model_kind, config.reason)
    log.debug("%s: the evidence: %s", measured.model_kind, evidence.model_dump_json())
    return config


def _speedup(pick: CandidateResult, baseline: CandidateResult, evidence: Evidence) -> float | None:
    """fp32 on the CPU's step time over the pick's, as the reason words it: from paired evidence (a chain of
    drops), its estimate or its bound (:func:`headline`), else the chain's estimate; from the mean step times of
    different moments where the chain breaks, unless they contradict the evidence (fp32 found slower): None."""
    found = next((r for r in evidence.rivals if r.candidate == FP32_CPU), None)
    claim = headline(found, pick.candidate, evidence) if found is not None else None
    if claim is not None:
        return claim[0]
    paired = times_over(found, pick.candidate, evidence) if found is not None else None
    if paired is not None:
        return paired
    unpaired = step_ms(baseline) / step_ms(pick)
    slower = found is not None and found.verdict in ("dropped", "slower", "outpaced")
    return None if slower and unpaired < 1 else unpaired


def restate(config: Decision, **flags: object) -> Decision:
    """``config`` with ``flags`` set on its evidence (e.g. ``older_rules="0.1.0"``) and its reason worded again."""
    evidence = (config.evidence or Evidence()).model_copy(update=flags)
    return config.model_copy(update={"evidence": evidence, "reason": reason(
        config.candidate, evidence, measured_at=config.measured_at)})


def picked(measured: FamilyResult) -> Candidate:
    """The candidate ``decide(measured)`` picks (no preference, nothing forced, a long job), without the reason
    or its log lines; raises CalibrationError when nothing can train it."""
    usable = finalists(measured)
    if not usable:
        raise _untrainable(measured)
    return pick_fastest(usable, None, alpha=decision_alpha(measured.candidates)).candidate


def _untrainable(measured: FamilyResult) -> CalibrationError:
    return CalibrationError(measured.model_kind, [(r.candidate.label, f"{r.failure.kind}: {r.failure.detail}")
                                                  for r in measured.candidates if r.failure is not None])


def decision_alpha(results: Sequence[CandidateResult]) -> float:
    """Each claim's error: one look's share split over the k - 1 pairs of any one finalist, k the candidates timed
    together in the final comparison as it began (those it dropped or outpaced since included: the split is
    fixed at its start, as each look's is, so a pair is not tested again at a larger alpha once others left). A
    pick is wrong only through a wrong verdict on a pair of the right answer (it wrongly beaten, or a pick
    wrongly resolved against it), so whichever pairs the rule compares, the chance of a wrong pick is at most one
    look's share per decision."""
    timed_together = sum(1 for r in results if r.timing is not None and r.timing.final)
    return _stats.ALPHA_PER_LOOK / max(1, timed_together - 1)


def pick_fastest(pool: Sequence[CandidateResult], expected_steps: int | None, *,
                 alpha: float) -> CandidateResult:
    """The pick among ``pool`` (finalists): on each device, the first one nothing there clearly beats, in the
    order the tie rule prefers (``_rules.preference``; layout and optimizer kernels by speed); then another
    device only if it clearly beats the CPU's pick. ``alpha``: each claim's error (:func:`decision_alpha`)."""
    picks = device_picks(pool, expected_steps, alpha=alpha)
    scores = ranking(list(picks.values()), expected_steps)
    best = min(picks.values(), key=lambda r: scores[id(r)])
    cpu = picks.get(CPU)
    if cpu is not None and best is not cpu and not clearly_faster(best, cpu, expected_steps, alpha=alpha):
        return cpu
    return best


def device_picks(pool: Sequence[CandidateResult], expected_steps: int | None, *,
                 alpha: float) -> dict[str, CandidateResult]:
    """Each device's pick among ``pool``: the first in the tie rule's order that no other candidate of its
    device clearly beats (or the first, if each one is beaten); between equally preferred ones, the faster on
    the rounds the two share, so one that left the final comparison early keeps its place."""
    picks = {}
    for device in dict.fromkeys(r.candidate.device for r in pool):
        on_device = [r for r in pool if r.candidate.device == device]
        order = sorted(on_device, key=functools.cmp_to_key(_before(expected_steps)))
        picks[device] = next((r for r in order if not _beaten(r, on_device, expected_steps, alpha)), order[0])
    return picks


def _before(expected_steps: int | None) -> Callable[[CandidateResult, CandidateResult], int]:
    """The tie rule's order of two candidates: the one a tie goes to, else the faster on the rounds they share."""
    def before(a: CandidateResult, b: CandidateResult) -> int:
        winner = tie_winner(a.candidate, b.candidate)
        if winner is not None:
            return -1 if winner == a.candidate else 1
        estimate = score_ratio(a, b, expected_steps)[0]
        return (estimate > 1) - (estimate < 1)

    return before


def _beaten(result: CandidateResult, others: Sequence[CandidateResult], expected_steps: int | None,
            alpha: float) -> bool:
    return any(clearly_faster(other, result, expected_steps, alpha=alpha) for other in others if other is not result)


def open_pairs(pick: CandidateResult, pool: Sequence[CandidateResult], expected_steps: int | None, *,
               alpha: float) -> list[Candidate]:
    """The candidates whose pair with ``pick`` (among ``pool``) was still open when timing stopped: neither clearly
    beaten nor surely within what the pair allows of the pick (``_rules.is_open``), so the pick may be further
    from the best than its margin and indifference allow. As in the final comparison, the pick rests on its pair
    with each candidate of its device that nothing beats and with each other device's pick, and one of those
    matters only while its own pair with the fastest of them is open (resolved, the pick's pair with the fastest
    answers for it)."""
    picks = device_picks(pool, expected_steps, alpha=alpha)
    on_device = [r for r in pool if r.candidate.device == pick.candidate.device]
    mine = [r for r in on_device if r is pick or not _beaten(r, on_device, expected_steps, alpha)]
    before = functools.cmp_to_key(_before(expected_steps))
    found = []
    for group in (mine, [pick, *(r for device, r in picks.items() if device != pick.candidate.device)]):
        scores = ranking(group, expected_steps)
        fastest = min(group, key=lambda r: scores[id(r)])
        for other in group:
            first, second = sorted((other, fastest), key=before)
            if other is not pick and _open(pick, other, expected_steps, alpha) and (
                    other is fastest or _open(first, second, expected_steps, alpha)):
                found.append(other.candidate)
    return found


def _open(first: CandidateResult, other: CandidateResult, expected_steps: int | None, alpha: float) -> bool:
    """Is the pair of ``first`` (the one the tie rule prefers) and ``other`` still open?"""
    return is_open(score_ratio(first, other, expected_steps, alpha=alpha), margin(first.candidate, other.candidate),
                   indifference(first.candidate, other.candidate),
                   tie_to_pick=tie_winner(first.candidate, other.candidate) == first.candidate)


def _unmeasured_forced(measured: FamilyResult, device: str, digest: str) -> Decision:
    devices = ", ".join(dict.fromkeys(r.candidate.device for r in measured.candidates))
    evidence = Evidence(forced=device, unmeasured=f"calibration did not measure {device} here (measured: {devices})",
                        noisy=measured.noisy, origin=measured.origin)
    chosen = Candidate(device=device, precision=FP32.name)
    config = Decision(**chosen.model_dump(), model_kind=measured.model_kind, source="forced",
                    reason=reason(chosen, evidence, measured_at=None), evidence=evidence,
                    fingerprint_digest=digest, measured_at=measured.measured_at)
    log.warning("%s: %s", measured.model_kind, config.reason)
    return config


# -- comparisons: mean step times on shared final rounds, paired ratios -------------------------------------------


def is_cpu(result: CandidateResult) -> bool:
    return result.candidate.device == CPU


def step_ms(result: CandidateResult) -> float:
    """Its mean step time (``Timing.mean_ms``): what a training loop pays per step, stalls included."""
    assert result.timing is not None
    return result.timing.mean_ms


def score_ms(result: CandidateResult, expected_steps: int | None, mean_ms: float | None = None) -> float:
    """Step time (``mean_ms``, else the timing's mean), or set-up + ``expected_steps`` steps for a short job."""
    mean_ms = step_ms(result) if mean_ms is None else mean_ms
    if expected_steps is None:
        return mean_ms
    return 1000 * (result.setup_s or 0.0) + expected_steps * mean_ms


def ranking(results: Sequence[CandidateResult], expected_steps: int | None) -> dict[int, float]:
    """Each result's score (by ``id``) for ranking ``results`` against one another: in the final comparison, the
    longest-timed one's mean times each one's paired ratio to it over the rounds the two share
    (:func:`_stats.paired_scores`), so one settled early is compared on its own rounds, never on a prefix; a
    timing from an earlier stage (a device outpaced there) by its own mean."""
    final = {id(r): r.timing.round_ms for r in results if r.timing is not None and r.timing.final}
    if len(final) < 2:
        return {id(r): score_ms(r, expected_steps) for r in results}
    ratios = _stats.paired_scores(final)
    longest: list[float] = max(final.values(), key=len)
    anchor_ms = statistics.fmean(longest)
    return {id(r): score_ms(r, expected_steps, anchor_ms * ratios[id(r)] if id(r) in final else None)
            for r in results}


def step_ratio(a: CandidateResult, b: CandidateResult, *,
               alpha: float = _stats.ALPHA_PER_LOOK) -> tuple[float, float, float]:
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
        return _stats.ratio_interval(a.timing.round_ms, b.timing.round_ms, alpha=alpha)
    return step_ms(a) / step_ms(b), 0.0, float("inf")


def score_ratio(a: CandidateResult, b: CandidateResult, expected_steps: int | None, *,
                alpha: float = _stats.ALPHA_PER_LOOK) -> tuple[float, float, float]:
    """``a``'s score over ``b``'s with its interval: the step-time ratio (:func:`step_ratio`), or, for a short
    job, set-up + steps x step time, the step time's bounds from the paired interval."""
    estimate, low, high = step_ratio(a, b, alpha=alpha)
    if expected_steps is None:
        return estimate, low, high

    def score(ratio: float) -> float:
        return (1000 * (a.setup_s or 0.0) + expected_steps * step_ms(b) * ratio) / score_ms(b, expected_steps)

    return score(estimate), score(low), score(high)


def clearly_faster(fast: CandidateResult, slow: CandidateResult, expected_steps: int | None, *,
                   alpha: float = _stats.ALPHA_PER_LOOK) -> bool:
    """True when ``fast`` beats ``slow`` by more than their margin, at the decision's confidence.

    For a short job the score is set-up + steps x step time; the step time's bound comes from the paired
    interval, the set-up times are single measurements.
    """
    _, _, high = step_ratio(fast, slow, alpha=alpha)
    if high == float("inf"):
        return False
    if expected_steps is None:
        return high * (1 + margin(fast.candidate, slow.candidate)) < 1
    slow_ms = step_ms(slow)
    fast_high_ms = 1000 * (fast.setup_s or 0.0) + expected_steps * slow_ms * high
    return fast_high_ms * (1 + margin(fast.candidate, slow.candidate)) < score_ms(slow, expected_steps)


# -- the evidence: every other candidate against the pick -------------------------------------------------------


def rival(pick: CandidateResult, other: CandidateResult, expected_steps: int | None, *,
          alpha: float = _stats.ALPHA_PER_LOOK) -> Rival:
    """``other`` against ``pick``: its verdict and its numbers (paired with the pick, or the evidence it stopped on)."""
    mine, theirs = pick.candidate, other.candidate
    role: Role = "device" if theirs.device != mine.device else "precision" if theirs.precision != mine.precision \
        else "variant"
    timing = other.timing
    facts = Rival(candidate=theirs, role=role, verdict="untimed", setup_s=other.setup_s, margin=margin(theirs, mine),
                  step_ms=timing.mean_ms if timing is not None else None)
    if other.failure is not None:
        return facts.model_copy(update={"verdict": "failed", "failure": other.failure})
    if timing is None:
        return facts
    stopped = timing.dropped or (timing.outpaced if theirs.device != mine.device else None)
    if stopped is not None:
        return facts.model_copy(update={
            "verdict": "dropped" if timing.dropped else "outpaced", "against": stopped.by, "ratio": stopped.ratio,
            "rounds": stopped.rounds, "far_behind": stopped.far_behind})
    estimate, low, high = step_ratio(other, pick, alpha=alpha)
    verdict: Verdict
    if high == float("inf"):
        verdict = "unpaired"
    elif (expected_steps is not None and estimate < 1
          and score_ms(other, expected_steps) > score_ms(pick, expected_steps)):
        verdict = "finishes later"
    elif clearly_faster(pick, other, expected_steps, alpha=alpha):
        verdict = "slower"
    elif clearly_faster(other, pick, expected_steps, alpha=alpha):
        verdict = "faster"
    else:
        verdict = "tie"
    return facts.model_copy(update={"verdict": verdict, "against": mine, "rounds": _paired_rounds(other, pick),
                                    "ratio": Interval(estimate=estimate, low=low, high=high)})


def _paired_rounds(a: CandidateResult, b: CandidateResult) -> int | None:
    """The rounds behind :func:`step_ratio`'s interval of ``a`` over ``b``; None where they were never paired."""
    assert a.timing is not None and b.timing is not None
    for slow, fast in ((a, b), (b, a)):
        outpaced = slow.timing.outpaced if slow.timing is not None else None
        if outpaced is not None and outpaced.by.device == fast.candidate.device:
            return outpaced.rounds
    if a.timing.stage == b.timing.stage and min(a.timing.n, b.timing.n) >= 2:
        return min(a.timing.n, b.timing.n)
    return None


__all__ = [
    "PREFERENCES",
    "Prefer",
    "clearly_faster",
    "decide",
    "decision_alpha",
    "device_picks",
    "finalists",
    "is_cpu",
    "open_pairs",
    "pick_fastest",
    "picked",
    "ranking",
    "restate",
    "rival",
    "score_ms",
    "score_ratio",
    "step_ms",
    "step_ratio",
]
