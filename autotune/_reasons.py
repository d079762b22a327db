"""The reason a Config gives: its device against the best of each other device, its precision and variants
against the alternatives on its device, with the numbers or the drop evidence behind each comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from autotune._compare import clearly_faster, is_cpu, score_ms, step_ms, step_ratio
from autotune._models import Candidate, CandidateResult, FamilyResult, Precision
from autotune._rules import complexity, margin

if TYPE_CHECKING:
    from autotune._decide import Prefer

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
    failed: Sequence[CandidateResult], measured: FamilyResult, prefer: Prefer, expected_steps: int | None,
) -> tuple[str, str]:
    device_sentence = f"{_device_words(pick)} {_PRECISION_WORDS[pick.candidate.precision]}" + "".join(
        f", {word}" for word in pick.candidate.variants)
    device_parts = [_against_device(pick, other, pool, measured.model_kind, prefer, expected_steps)
                    for other in _best_per(usable, lambda r: r.candidate.device, exclude=pick.candidate.device)]
    if device_parts:
        device_sentence += " (" + "; ".join(device_parts) + ")"
    device_sentence += "."

    # Precision sentence: the pick against each other precision on its device, then against its own plain
    # configuration, with numbers; a candidate dropped earlier is described by its drop evidence.
    same = [r for r in measured.candidates if r.usable and r.candidate.device == pick.candidate.device]
    parts = [_against_precision(pick, other)
             for other in _best_per(same, lambda r: r.candidate.precision, exclude=pick.candidate.precision)]
    plain = next((r for r in same if r.candidate == pick.candidate.base and r is not pick), None)
    if plain is not None:
        parts.append(_against_simpler(pick, plain, pick.candidate.variant_words.strip()))
    if len(pick.candidate.variants) > 1:  # each variant on its own: the pick without it
        base = pick.candidate.base
        for field in Candidate.model_fields:
            if getattr(pick.candidate, field) == getattr(base, field):
                continue
            without = pick.candidate.model_copy(update={field: getattr(base, field)})
            simpler = next((r for r in same if r.candidate == without), None)
            if simpler is not None:
                word = next(w for w in pick.candidate.variants if w not in without.variants)
                parts.append(_against_simpler(pick, simpler, word))
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
                    prefer: Prefer, expected_steps: int | None) -> str:
    where = "the CPU" if is_cpu(other) else other.candidate.device
    estimate, low, high = step_ratio(other, pick)
    slower_overall = expected_steps is not None and score_ms(other, expected_steps) > score_ms(pick, expected_steps)
    if expected_steps is not None and estimate < 1 and slower_overall:
        return (f"for {expected_steps} steps it finishes first: {where}'s set-up {other.setup_s or 0:.1f} s "
                f"outweighs its {step_ms(pick) - step_ms(other):.1f} ms/step advantage")
    if is_cpu(pick) and other in pool and not clearly_faster(pick, other, expected_steps):
        return (f"{where} was no faster ({_numbers(pick, other)}, its time over the CPU's {estimate:.2f}x, interval "
                f"{low:.2f}-{high:.2f}): on a tie the CPU wins, with no driver, no device memory held, no copies")
    if estimate >= 1:
        return f"{estimate:.1f}x faster than {where}"
    if other not in pool:
        return f"{prefer.upper()} as requested; {where} is {1 / estimate:.1f}x faster for {kind}"
    return f"{where} is {1 / estimate:.1f}x faster"


def _against_precision(pick: CandidateResult, other: CandidateResult) -> str:
    label = other.candidate.precision + other.candidate.variant_words
    if other.timing is not None and other.timing.dropped is not None:
        return f"{label} {other.timing.dropped.describe()}"
    estimate, low, high = step_ratio(other, pick)
    numbers = f"{_numbers(pick, other)}, interval {low:.2f}-{high:.2f}"
    if complexity(other.candidate) < complexity(pick.candidate):
        return f"{estimate:.2f}x faster than {label} ({numbers}x)"
    if clearly_faster(pick, other, None):
        return f"{label} is {estimate:.2f}x slower ({numbers})"
    within = f"{margin(pick.candidate, other.candidate):.0%} margin"
    return f"{label} not faster by more than the {within} ({numbers}: {estimate:.2f}x); on a tie the simpler wins"


def _against_simpler(pick: CandidateResult, simpler: CandidateResult, words: str) -> str:
    """Why the pick's variant ``words`` beat ``simpler``, the pick without them: its drop evidence, or numbers."""
    name = (f"{simpler.candidate.precision}{simpler.candidate.variant_words}" if simpler.candidate.variants
            else f"plain {simpler.candidate.precision}")
    if simpler.timing is not None and simpler.timing.dropped is not None:
        return f"{words}: {name} {simpler.timing.dropped.describe()}"
    estimate, low, high = step_ratio(simpler, pick)
    return f"{words} {estimate:.2f}x faster than {name} ({_numbers(pick, simpler)}, interval {low:.2f}-{high:.2f}x)"


__all__ = ["explain", "no_gpu_words"]
