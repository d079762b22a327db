"""From raw measurements to one Config with its reason. Pure: no device is touched here.

Rules, in order:
1. Only candidates that were timed and passed the numerics gate can be picked, and only those timed in the
   final paired comparison (a candidate dropped earlier is clearly slower, with its evidence, and never wins).
2. The user's preference selects the pool: ``auto`` everything, ``cpu`` the CPU, ``gpu`` any accelerator
   whatever its backend; with no usable accelerator the CPU answers and the reason and a WARNING say so.
3. The fastest wins on step time (ranked on paired estimates: ``ranking``), or on set-up + ``expected_steps``
   x step time for a short job.
4. It must beat a preferred candidate on its device (fp32 < tf32 < bf16 < fp16, torch's thread count, eager:
   ``_rules.preference``) by more than ``_rules.margin`` with the decision's confidence
   (``_stats.ratio_interval``, paired over the final rounds, its error split over the pairs the pick rests
   on: ``decision_alpha``); otherwise it is a tie and the preferred one wins. Layout and optimizer kernels
   (the same math) go to the faster.
5. Another device must beat the CPU the same way, by ``_rules.MARGIN``; on a tie the CPU wins (no driver, no
   device memory held, no copies) and the reason says the GPU was no faster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal

from autotune import _stats
from autotune._config import Config
from autotune._errors import CalibrationError
from autotune._models import Candidate, CandidateResult, FamilyResult, Precision, Prefer
from autotune._rules import complexity, margin, preference

log = logging.getLogger("autotune")

PREFERENCES: tuple[Prefer, ...] = ("auto", "gpu", "cpu")


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
) -> Config:
    """The Config for ``measured.model_kind``; raises CalibrationError when nothing can train it."""
    usable = finalists(measured)
    failed = [r for r in measured.candidates if r.failure is not None]
    if not usable:
        raise _untrainable(measured)
    notes: list[str] = []
    source: Literal["measured", "forced"] = "measured"
    if forced_device is not None:
        source = "forced"
        pool = [r for r in usable if r.candidate.device == forced_device]
        if not pool:
            return _unmeasured_forced(measured, forced_device, digest)
        notes.append(f"Device forced by AUTOTUNE_DEVICE={forced_device}.")
    elif prefer == "cpu":
        pool = [r for r in usable if is_cpu(r)]
    elif prefer == "gpu":
        pool = [r for r in usable if not is_cpu(r)]
        if not pool:
            pool = [r for r in usable if is_cpu(r)]
            why = no_gpu_words(measured)
            log.warning("%s: GPU requested but %s; training on the CPU", measured.model_kind, why)
            notes.append(f"GPU requested, but {why}.")
    else:
        pool = usable

    alpha = decision_alpha(usable)
    pick = pick_fastest(pool, expected_steps, alpha=alpha)
    device_sentence, precision_sentence = explain(pick, pool, usable, failed, measured, prefer, expected_steps,
                                                  alpha=alpha)
    reason = " ".join([*notes, device_sentence, precision_sentence]).strip()
    baseline = next((r for r in measured.candidates if r.usable and r.candidate == r.candidate.base
                     and is_cpu(r) and r.candidate.precision == "fp32"), None)
    config = Config(
        **pick.candidate.model_dump(),
        model_kind=measured.model_kind,
        source=source,
        reason=reason,
        step_ms=step_ms(pick),
        setup_s=pick.setup_s,
        speedup_vs_fp32_cpu=step_ms(baseline) / step_ms(pick) if baseline else None,
        init_scale=pick.numerics.init_scale if pick.numerics else None,
        peak_memory_mb=pick.peak_bytes / 2**20 if pick.peak_bytes is not None else None,
        noisy=measured.noisy,
        fingerprint_digest=digest,
        measured_at=measured.measured_at,
    )
    log.info("Training device for %s: %s", measured.model_kind, device_sentence)
    log.info("Precision for %s: %s", measured.model_kind, precision_sentence)
    return config


def picked(measured: FamilyResult) -> Candidate:
    """The candidate ``decide(measured)`` picks (no preference, nothing forced, a long job), without the reason
    or its log lines; raises CalibrationError when nothing can train it."""
    usable = finalists(measured)
    if not usable:
        raise _untrainable(measured)
    return pick_fastest(usable, None).candidate


def _untrainable(measured: FamilyResult) -> CalibrationError:
    return CalibrationError(measured.model_kind, [(r.candidate.label, f"{r.failure.kind}: {r.failure.detail}")
                                                  for r in measured.candidates if r.failure is not None])


def decision_alpha(finalists: Sequence[CandidateResult]) -> float:
    """One look's error share split over the pairs a pick rests on (each candidate of the final comparison
    against it): the error control is per decision, as in the final comparison's first look."""
    timed_together = sum(1 for r in finalists if r.timing is not None and r.timing.final)
    return _stats.ALPHA_PER_LOOK / max(1, timed_together - 1)


def pick_fastest(pool: Sequence[CandidateResult], expected_steps: int | None, *,
                 alpha: float | None = None) -> CandidateResult:
    """The pick among ``pool`` (finalists): on each device, of the candidates nothing there clearly beats,
    the preferred one (``_rules.preference``; layout and optimizer kernels by speed); then another device
    only if it clearly beats the CPU's pick. ``alpha``: each claim's error (default: :func:`decision_alpha`)."""
    alpha = decision_alpha(pool) if alpha is None else alpha
    picks = {}
    for device in dict.fromkeys(r.candidate.device for r in pool):
        on_device = [r for r in pool if r.candidate.device == device]
        unbeaten = [r for r in on_device if not any(clearly_faster(other, r, expected_steps, alpha=alpha)
                                                    for other in on_device if other is not r)]
        scores = ranking(unbeaten or on_device, expected_steps)
        picks[device] = min(unbeaten or on_device, key=lambda r: (preference(r.candidate), scores[id(r)]))
    scores = ranking(list(picks.values()), expected_steps)
    best = min(picks.values(), key=lambda r: scores[id(r)])
    cpu = picks.get("cpu")
    if cpu is not None and best is not cpu and not clearly_faster(best, cpu, expected_steps, alpha=alpha):
        return cpu
    return best


def _unmeasured_forced(measured: FamilyResult, device: str, digest: str) -> Config:
    reason = (
        f"Device forced by AUTOTUNE_DEVICE={device}, which calibration did not measure here "
        f"(measured: {', '.join(dict.fromkeys(r.candidate.device for r in measured.candidates))}); using fp32."
    )
    log.warning("%s: %s", measured.model_kind, reason)
    return Config(model_kind=measured.model_kind, device=device, precision="fp32", source="forced",
                  reason=reason, fingerprint_digest=digest, measured_at=measured.measured_at)


# -- comparisons: step medians on shared final rounds, paired ratios -------------------------------------------


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
    """Each result's score (by ``id``) for ranking ``results`` against one another: in the final comparison, the
    longest-timed one's median times each one's paired ratio to it over the rounds the two share
    (:func:`_stats.paired_scores`), so one settled early is compared on its own rounds, never on a prefix; a
    timing from an earlier stage (a device outpaced there) by its own median."""
    final = {id(r): r.timing.round_ms for r in results if r.timing is not None and r.timing.final}
    if len(final) < 2:
        return {id(r): score_ms(r, expected_steps) for r in results}
    ratios = _stats.paired_scores(final)
    anchor_ms = _stats.median(max(final.values(), key=len))
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


# -- the reason --------------------------------------------------------------------------------------------------

_PRECISION_WORDS: dict[Precision, str] = {
    "fp32": "in fp32",
    "tf32": "in fp32 with TF32 matmuls",
    "bf16-mixed": "with bf16 mixed precision",
    "fp16-mixed": "with fp16 mixed precision",
}


def _device_words(result: CandidateResult) -> str:
    device = result.candidate.device
    name = result.device_name or device
    return f"CPU ({name})" if device == "cpu" else f"{device} ({name})"


def _failure_words(result: CandidateResult) -> str:
    failure = result.failure
    assert failure is not None
    if failure.kind == "too_slow":
        return f"{result.candidate.label} too slow: {failure.detail}"
    if failure.kind == "numerics":
        return f"{result.candidate.label} rejected: {failure.detail}"
    return f"{result.candidate.label} {failure.kind.replace('_', ' ')} on this machine ({failure.detail})"


def no_gpu_words(measured: FamilyResult) -> str:
    gpu_failures = [r for r in measured.candidates if not is_cpu(r) and r.failure is not None]
    if gpu_failures:
        return "every GPU candidate failed (" + "; ".join(_failure_words(r) for r in gpu_failures) + ")"
    notes = "; ".join(f"{name}: {why}" for name, why in measured.backend_notes.items() if name != "cpu")
    return f"there is no usable GPU ({notes})" if notes else "there is no usable GPU"


def explain(
    pick: CandidateResult, pool: Sequence[CandidateResult], usable: Sequence[CandidateResult],
    failed: Sequence[CandidateResult], measured: FamilyResult, prefer: Prefer, expected_steps: int | None, *,
    alpha: float = _stats.ALPHA_PER_LOOK,
) -> tuple[str, str]:
    device_sentence = f"{_device_words(pick)} {_PRECISION_WORDS[pick.candidate.precision]}" + "".join(
        f", {word}" for word in pick.candidate.variants)
    device_parts = [_against_device(pick, other, pool, measured.model_kind, prefer, expected_steps, alpha)
                    for other in _best_per(usable, lambda r: r.candidate.device, exclude=pick.candidate.device)]
    if device_parts:
        device_sentence += " (" + "; ".join(device_parts) + ")"
    device_sentence += "."

    # Precision sentence: the pick against each other precision on its device, then against its own plain
    # configuration, with numbers; a candidate dropped earlier is described by its drop evidence.
    same = [r for r in measured.candidates if r.usable and r.candidate.device == pick.candidate.device]
    parts = [_against_precision(pick, other, alpha)
             for other in _best_per(same, lambda r: r.candidate.precision, exclude=pick.candidate.precision)]
    plain = next((r for r in same if r.candidate == pick.candidate.base and r is not pick), None)
    if plain is not None:
        parts.append(_against_simpler(pick, plain, pick.candidate.variant_words.strip(), alpha))
    if len(pick.candidate.variants) > 1:  # each variant on its own: the pick without it
        base = pick.candidate.base
        for field in Candidate.model_fields:
            if getattr(pick.candidate, field) == getattr(base, field):
                continue
            without = pick.candidate.model_copy(update={field: getattr(base, field)})
            simpler = next((r for r in same if r.candidate == without), None)
            if simpler is not None:
                word = next(w for w in pick.candidate.variants if w not in without.variants)
                parts.append(_against_simpler(pick, simpler, word, alpha))
    if pick.numerics is not None and pick.numerics.default_scale_skipped:
        parts.append(
            f"GradScaler starts at init_scale {pick.numerics.init_scale:g}: the default 65536 skipped "
            f"{pick.numerics.default_scale_skipped} of {len(pick.numerics.losses)} steps"
        )
    parts += [_failure_words(r) for r in failed if r.candidate.device == pick.candidate.device
              and r.candidate == r.candidate.base]
    described = f"{pick.candidate.precision}{pick.candidate.variant_words} at {step_ms(pick):.3g} ms/step"
    precision_sentence = f"{described}: " + "; ".join(parts) + "." if parts else f"{described}."
    return device_sentence, precision_sentence


def _best_per(results: Sequence[CandidateResult], key: Callable[[CandidateResult], str],
              exclude: str) -> list[CandidateResult]:
    """One representative per key (device or precision): the fastest finalist, else the plain candidate."""
    best: dict[str, CandidateResult] = {}
    ranked = sorted(results, key=lambda r: (not (r.timing is not None and r.timing.final),
                                            r.candidate != r.candidate.base, step_ms(r)))
    for result in ranked:
        if key(result) != exclude:
            best.setdefault(key(result), result)
    return list(best.values())


def _numbers(pick: CandidateResult, other: CandidateResult) -> str:
    return f"{step_ms(pick):.3g} vs {step_ms(other):.3g} ms/step"


def _against_device(pick: CandidateResult, other: CandidateResult, pool: Sequence[CandidateResult], kind: str,
                    prefer: Prefer, expected_steps: int | None, alpha: float) -> str:
    where = "the CPU" if is_cpu(other) else other.candidate.device
    estimate, low, high = step_ratio(other, pick, alpha=alpha)
    slower_overall = expected_steps is not None and score_ms(other, expected_steps) > score_ms(pick, expected_steps)
    if expected_steps is not None and estimate < 1 and slower_overall:
        return (f"for {expected_steps} steps it finishes first: {where}'s set-up {other.setup_s or 0:.1f} s "
                f"outweighs its {step_ms(pick) - step_ms(other):.1f} ms/step advantage")
    if is_cpu(pick) and other in pool and not clearly_faster(pick, other, expected_steps, alpha=alpha):
        return (f"{where} was no faster ({_numbers(pick, other)}, its time over the CPU's {estimate:.2f}x, interval "
                f"{low:.2f}-{high:.2f}): on a tie the CPU wins, with no driver, no device memory held, no copies")
    if estimate >= 1:
        return f"{estimate:.1f}x faster than {where}"
    if other not in pool:
        return f"{prefer.upper()} as requested; {where} is {1 / estimate:.1f}x faster for {kind}"
    return f"{where} is {1 / estimate:.1f}x faster"


def _against_precision(pick: CandidateResult, other: CandidateResult, alpha: float) -> str:
    label = other.candidate.precision + other.candidate.variant_words
    if other.timing is not None and other.timing.dropped is not None:
        return f"{label} {other.timing.dropped.describe()}"
    estimate, low, high = step_ratio(other, pick, alpha=alpha)
    numbers = f"{_numbers(pick, other)}, interval {low:.2f}-{high:.2f}"
    if complexity(other.candidate) < complexity(pick.candidate):
        return f"{estimate:.2f}x faster than {label} ({numbers}x)"
    if clearly_faster(pick, other, None, alpha=alpha):
        return f"{label} is {estimate:.2f}x slower ({numbers})"
    within = f"{margin(pick.candidate, other.candidate):.0%} margin"
    return f"{label} not faster by more than the {within} ({numbers}: {estimate:.2f}x); on a tie the simpler wins"


def _against_simpler(pick: CandidateResult, simpler: CandidateResult, words: str, alpha: float) -> str:
    """Why the pick's variant ``words`` beat ``simpler``, the pick without them: its drop evidence, or numbers."""
    name = (f"{simpler.candidate.precision}{simpler.candidate.variant_words}" if simpler.candidate.variants
            else f"plain {simpler.candidate.precision}")
    if simpler.timing is not None and simpler.timing.dropped is not None:
        return f"{words}: {name} {simpler.timing.dropped.describe()}"
    estimate, low, high = step_ratio(simpler, pick, alpha=alpha)
    return f"{words} {estimate:.2f}x faster than {name} ({_numbers(pick, simpler)}, interval {low:.2f}-{high:.2f}x)"


__all__ = [
    "PREFERENCES",
    "Prefer",
    "clearly_faster",
    "decide",
    "decision_alpha",
    "explain",
    "finalists",
    "is_cpu",
    "no_gpu_words",
    "pick_fastest",
    "picked",
    "ranking",
    "score_ms",
    "step_ms",
    "step_ratio",
]
