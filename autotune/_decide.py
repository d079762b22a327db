"""From raw measurements to one Config with its reason. Pure: no device is touched here.

Rules, in order:
1. Only candidates that were timed and passed the numerics gate can be picked.
2. The user's preference selects the pool: ``auto`` everything, ``cpu`` the CPU, ``gpu`` any accelerator
   whatever its backend; with no usable accelerator the CPU answers and the reason and a WARNING say so.
3. The fastest wins on step time, or on set-up + ``expected_steps`` x step time for a short job.
4. A faster candidate must beat a simpler one on the same device (fp32 < tf32 < bf16 < fp16) by more than the
   margin with 95% confidence; otherwise it is a tie and the simpler one wins.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from autotune import _stats
from autotune._config import Config
from autotune._errors import CalibrationError
from autotune._models import Candidate, CandidateResult, FamilyResult, Precision

log = logging.getLogger("autotune")

Prefer = Literal["auto", "gpu", "cpu"]
PREFERENCES: tuple[Prefer, ...] = ("auto", "gpu", "cpu")
MARGIN = 0.03

_SIMPLICITY: dict[Precision, int] = {"fp32": 0, "tf32": 1, "bf16-mixed": 2, "fp16-mixed": 3}
_PRECISION_WORDS: dict[Precision, str] = {
    "fp32": "in fp32",
    "tf32": "in fp32 with TF32 matmuls",
    "bf16-mixed": "with bf16 mixed precision",
    "fp16-mixed": "with fp16 mixed precision",
}


def _is_cpu(result: CandidateResult) -> bool:
    return result.candidate.device == "cpu"


def _step_ms(result: CandidateResult) -> float:
    assert result.timing is not None  # noqa: S101 - only usable results reach here
    return result.timing.median_ms


def _score_ms(result: CandidateResult, expected_steps: int | None) -> float:
    if expected_steps is None:
        return _step_ms(result)
    return 1000 * (result.setup_s or 0.0) + expected_steps * _step_ms(result)


def step_ratio(a: CandidateResult, b: CandidateResult) -> tuple[float, float, float]:
    """Step-time ratio a/b with its 95% interval: paired by round when both were timed in the same stage."""
    assert a.timing is not None and b.timing is not None  # noqa: S101 - only usable results reach here
    if a.timing.stage == b.timing.stage:
        return _stats.ratio_interval(a.timing.round_ms, b.timing.round_ms)
    return _stats.unpaired_ratio_interval(a.timing.round_ms, b.timing.round_ms)


def _complexity(candidate: Candidate) -> tuple[int, ...]:
    """Lower is simpler: fp32 < tf32 < bf16 < fp16, then each non-default variant setting adds to it."""
    return (
        _SIMPLICITY[candidate.precision],
        int(candidate.memory_format != "contiguous") + int(candidate.optimizer != "default")
        + int(candidate.threads is not None) + int(candidate.compiled),
    )


def _clearly_faster(fast: CandidateResult, slow: CandidateResult, expected_steps: int | None) -> bool:
    if expected_steps is not None:
        return _score_ms(fast, expected_steps) * (1 + MARGIN) < _score_ms(slow, expected_steps)
    _, _, high = step_ratio(fast, slow)
    return high * (1 + MARGIN) < 1


def _device_words(result: CandidateResult) -> str:
    device = result.candidate.device
    name = result.device_name or device
    return f"CPU ({name})" if device == "cpu" else f"{device} ({name})"


def _failure_words(result: CandidateResult) -> str:
    failure = result.failure
    assert failure is not None  # noqa: S101
    if failure.kind == "too_slow":
        return f"{result.candidate.label} too slow: {failure.detail}"
    if failure.kind == "numerics":
        return f"{result.candidate.label} rejected: {failure.detail}"
    return f"{result.candidate.label} {failure.kind.replace('_', ' ')} on this machine ({failure.detail})"


def decide(
    measured: FamilyResult,
    *,
    prefer: Prefer = "auto",
    expected_steps: int | None = None,
    forced_device: str | None = None,
    digest: str,
) -> Config:
    """The Config for ``measured.model_kind``; raises CalibrationError when nothing can train it."""
    usable = [r for r in measured.candidates if r.usable]
    failed = [r for r in measured.candidates if r.failure is not None]
    if not usable:
        raise CalibrationError(
            measured.model_kind, [(r.candidate.label, f"{r.failure.kind}: {r.failure.detail}") for r in failed if r.failure]
        )
    notes: list[str] = []
    source: Literal["measured", "forced"] = "measured"
    if forced_device is not None:
        source = "forced"
        pool = [r for r in usable if r.candidate.device == forced_device]
        if not pool:
            return _unmeasured_forced(measured, forced_device, digest)
        notes.append(f"Device forced by AUTOTUNE_DEVICE={forced_device}.")
    elif prefer == "cpu":
        pool = [r for r in usable if _is_cpu(r)]
    elif prefer == "gpu":
        pool = [r for r in usable if not _is_cpu(r)]
        if not pool:
            pool = [r for r in usable if _is_cpu(r)]
            why = _no_gpu_words(measured)
            log.warning("%s: GPU requested but %s; training on the CPU", measured.model_kind, why)
            notes.append(f"GPU requested, but {why}.")
    else:
        pool = usable

    pick = pick_fastest(pool, expected_steps)
    device_sentence, precision_sentence = _explain(pick, pool, usable, failed, measured, prefer, expected_steps)
    reason = " ".join([*notes, device_sentence, precision_sentence]).strip()
    baseline = next((r for r in usable if _is_cpu(r) and r.candidate.precision == "fp32"), None)
    config = Config(
        model_kind=measured.model_kind,
        device=pick.candidate.device,
        precision=pick.candidate.precision,
        source=source,
        reason=reason,
        step_ms=_step_ms(pick),
        setup_s=pick.setup_s,
        speedup_vs_fp32_cpu=_step_ms(baseline) / _step_ms(pick) if baseline else None,
        init_scale=pick.numerics.init_scale if pick.numerics else None,
        num_threads=pick.candidate.threads,
        memory_format=pick.candidate.memory_format,
        optimizer=pick.candidate.optimizer,
        compiled=pick.candidate.compiled,
        noisy=measured.noisy,
        fingerprint_digest=digest,
        measured_at=measured.measured_at,
    )
    log.info("Training device for %s: %s", measured.model_kind, device_sentence)
    log.info("Precision for %s: %s", measured.model_kind, precision_sentence)
    return config


def pick_fastest(pool: Sequence[CandidateResult], expected_steps: int | None) -> CandidateResult:
    """The fastest of ``pool``, unless a simpler one on its device is not clearly slower (then the simplest)."""
    leader = min(pool, key=lambda r: _score_ms(r, expected_steps))
    simpler = [
        r for r in pool
        if r.candidate.device == leader.candidate.device
        and _complexity(r.candidate) < _complexity(leader.candidate)
        and not _clearly_faster(leader, r, expected_steps)
    ]
    return min(simpler, key=lambda r: (_complexity(r.candidate), _step_ms(r))) if simpler else leader


def _no_gpu_words(measured: FamilyResult) -> str:
    gpu_failures = [r for r in measured.candidates if not _is_cpu(r) and r.failure is not None]
    if gpu_failures:
        return "every GPU candidate failed (" + "; ".join(_failure_words(r) for r in gpu_failures) + ")"
    notes = "; ".join(f"{name}: {why}" for name, why in measured.backend_notes.items() if name != "cpu")
    return f"there is no usable GPU ({notes})" if notes else "there is no usable GPU"


def _explain(
    pick: CandidateResult, pool: Sequence[CandidateResult], usable: Sequence[CandidateResult],
    failed: Sequence[CandidateResult], measured: FamilyResult, prefer: Prefer, expected_steps: int | None,
) -> tuple[str, str]:
    kind = measured.model_kind
    device = _device_words(pick)
    # Device sentence: how the pick compares with the best candidate on each other device.
    device_parts = []
    for other_device in dict.fromkeys(r.candidate.device for r in usable if r.candidate.device != pick.candidate.device):
        best_other = min((r for r in usable if r.candidate.device == other_device), key=_step_ms)
        ratio = _step_ms(best_other) / _step_ms(pick)
        where = "the CPU" if _is_cpu(best_other) else other_device
        if expected_steps is not None and _score_ms(best_other, expected_steps) > _score_ms(pick, expected_steps) and ratio < 1:
            device_parts.append(
                f"for {expected_steps} steps it finishes first: {where}'s set-up {best_other.setup_s or 0:.1f} s "
                f"outweighs its {_step_ms(pick) - _step_ms(best_other):.1f} ms/step advantage"
            )
        elif ratio >= 1:
            device_parts.append(f"{ratio:.1f}x faster than {where}")
        elif best_other not in pool:
            device_parts.append(f"{prefer.upper()} as requested; {where} is {1 / ratio:.1f}x faster for {kind}")
        else:
            device_parts.append(f"{where} is {1 / ratio:.1f}x faster")
    device_sentence = f"{device} {_PRECISION_WORDS[pick.candidate.precision]}" + "".join(
        f", {word}" for word in pick.candidate.variants)
    if device_parts:
        device_sentence += " (" + "; ".join(device_parts) + ")"
    device_sentence += "."

    # Precision sentence: the pick against the best of each other precision on its device, with numbers;
    # then, for a variant, what its settings gained over the plain configuration.
    same = [r for r in usable if r.candidate.device == pick.candidate.device and r is not pick]
    best_per_precision: dict[str, CandidateResult] = {}
    for other in sorted(same, key=_step_ms):
        best_per_precision.setdefault(other.candidate.precision, other)
    parts = []
    for other in best_per_precision.values():
        if other.candidate.precision == pick.candidate.precision:
            continue
        estimate, low, high = step_ratio(other, pick)
        label = other.candidate.precision + other.candidate.variant_words
        numbers = f"{_step_ms(pick):.3g} vs {_step_ms(other):.3g} ms/step"
        if _SIMPLICITY[other.candidate.precision] < _SIMPLICITY[pick.candidate.precision]:
            parts.append(f"{estimate:.2f}x faster than {label} ({numbers}, interval {low:.2f}-{high:.2f}x)")
        elif low * (1 - MARGIN) > 1 or (expected_steps is not None and estimate > 1 + MARGIN):
            parts.append(f"{label} is {estimate:.2f}x slower ({numbers})")
        else:
            parts.append(f"no measurable difference with {label} ({numbers}: {estimate:.2f}x, "
                         f"interval {low:.2f}-{high:.2f})")
    plain = next((r for r in same if r.candidate == pick.candidate.base), None)
    if plain is not None:
        estimate, low, high = step_ratio(plain, pick)
        parts.append(f"{pick.candidate.variant_words.strip()} {estimate:.2f}x faster than plain "
                     f"{pick.candidate.precision} ({_step_ms(pick):.3g} vs {_step_ms(plain):.3g} ms/step, "
                     f"interval {low:.2f}-{high:.2f}x)")
    if pick.numerics is not None and pick.numerics.default_scale_skipped:
        parts.append(
            f"GradScaler starts at init_scale {pick.numerics.init_scale:g}: the default 65536 skipped "
            f"{pick.numerics.default_scale_skipped} of {len(pick.numerics.losses)} steps"
        )
    parts += [_failure_words(r) for r in failed if r.candidate.device == pick.candidate.device
              and r.candidate == r.candidate.base]
    described = pick.candidate.precision + pick.candidate.variant_words
    precision_sentence = f"{described}: " + "; ".join(parts) + "." if parts else f"{described}."
    return device_sentence, precision_sentence


def _unmeasured_forced(measured: FamilyResult, device: str, digest: str) -> Config:
    reason = (
        f"Device forced by AUTOTUNE_DEVICE={device}, which calibration did not measure here "
        f"(measured: {', '.join(dict.fromkeys(r.candidate.device for r in measured.candidates))}); using fp32."
    )
    log.warning("%s: %s", measured.model_kind, reason)
    return Config(model_kind=measured.model_kind, device=device, precision="fp32", source="forced",
                  reason=reason, fingerprint_digest=digest, measured_at=measured.measured_at)


def heuristic(model_kind: str, why: str, digest: str) -> Config:
    """The safe answer when nothing was measured: fp32 on the CPU, and the reason why."""
    reason = f"Not measured: {why}. Using fp32 on the CPU, which always trains correctly."
    log.warning("%s: %s", model_kind, reason)
    return Config(model_kind=model_kind, device="cpu", precision="fp32", source="heuristic",
                  reason=reason, fingerprint_digest=digest)


__all__ = ["MARGIN", "PREFERENCES", "Prefer", "decide", "heuristic", "pick_fastest", "step_ratio"]
