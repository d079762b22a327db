"""From raw measurements to one Config with its reason. Pure: no device is touched here.

Rules, in order:
1. Only candidates that were timed and passed the numerics gate can be picked, and only those timed in the
   final paired comparison (a candidate dropped earlier is clearly slower, with its evidence, and never wins).
2. The user's preference selects the pool: ``auto`` everything, ``cpu`` the CPU, ``gpu`` any accelerator
   whatever its backend; with no usable accelerator the CPU answers and the reason and a WARNING say so.
3. The fastest wins on step time, or on set-up + ``expected_steps`` x step time for a short job.
4. It must beat a preferred candidate on its device (fp32 < tf32 < bf16 < fp16, torch's thread count, eager:
   ``_rules.preference``) by more than ``_rules.margin`` with the decision's confidence
   (``_stats.ratio_interval``, paired over the final rounds); otherwise it is a tie and the preferred one
   wins. Layout and optimizer kernels (the same math) go to the faster, on the final rounds they share.
5. Another device must beat the CPU the same way, by ``_rules.MARGIN``; on a tie the CPU wins (no driver, no
   device memory held, no copies) and the reason says the GPU was no faster.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from autotune._compare import clearly_faster, is_cpu, ranking, step_ms
from autotune._config import Config
from autotune._errors import CalibrationError
from autotune._models import CandidateResult, FamilyResult
from autotune._reasons import explain, no_gpu_words
from autotune._rules import preference

log = logging.getLogger("autotune")

Prefer = Literal["auto", "gpu", "cpu"]
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
        raise CalibrationError(
            measured.model_kind,
            [(r.candidate.label, f"{r.failure.kind}: {r.failure.detail}") for r in failed if r.failure],
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

    pick = pick_fastest(pool, expected_steps)
    device_sentence, precision_sentence = explain(pick, pool, usable, failed, measured, prefer, expected_steps)
    reason = " ".join([*notes, device_sentence, precision_sentence]).strip()
    baseline = next((r for r in measured.candidates if r.usable and r.candidate == r.candidate.base
                     and is_cpu(r) and r.candidate.precision == "fp32"), None)
    config = Config(
        model_kind=measured.model_kind,
        device=pick.candidate.device,
        precision=pick.candidate.precision,
        source=source,
        reason=reason,
        step_ms=step_ms(pick),
        setup_s=pick.setup_s,
        speedup_vs_fp32_cpu=step_ms(baseline) / step_ms(pick) if baseline else None,
        init_scale=pick.numerics.init_scale if pick.numerics else None,
        peak_memory_mb=pick.peak_bytes / 2**20 if pick.peak_bytes is not None else None,
        num_threads=pick.candidate.num_threads,
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
    """The pick among ``pool`` (finalists): on each device, of the candidates nothing there clearly beats,
    the preferred one (``_rules.preference``; layout and optimizer kernels by speed); then another device
    only if it clearly beats the CPU's pick."""
    picks = {}
    for device in dict.fromkeys(r.candidate.device for r in pool):
        on_device = [r for r in pool if r.candidate.device == device]
        unbeaten = [r for r in on_device
                    if not any(clearly_faster(other, r, expected_steps) for other in on_device if other is not r)]
        scores = ranking(unbeaten or on_device, expected_steps)
        picks[device] = min(unbeaten or on_device, key=lambda r: (preference(r.candidate), scores[id(r)]))
    scores = ranking(list(picks.values()), expected_steps)
    best = min(picks.values(), key=lambda r: scores[id(r)])
    cpu = picks.get("cpu")
    if cpu is not None and best is not cpu and not clearly_faster(best, cpu, expected_steps):
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


__all__ = ["PREFERENCES", "Prefer", "decide", "finalists", "pick_fastest"]
