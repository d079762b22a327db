"""Calibrate one model family: plan, set up and verify each candidate, then time the survivors.

This runs inside the calibration worker (or, in the unsafe in-process mode, in the host). It reports through
``emit``, one JSON-able event at a time, so a native crash loses only the candidate in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autotune import _stats
from autotune._families import Family
from autotune._measure import MeasureSettings, interleave, warm_up
from autotune._models import Candidate, CandidateResult, Failure, Interval, Timing
from autotune._step import TrainStep
from autotune._verify import INIT_SCALES, Trajectory, compare
from autotune.backends import Backend, all_backends, backend_for

Emit = Callable[[dict[str, Any]], None]

BASELINE = Candidate(device="cpu", precision="fp32")


@dataclass(frozen=True)
class Settings:
    """What the host asks of one family's calibration."""

    seed: int = 0
    verify_steps: int = 8
    #: a first step this many times slower than the same device's best first step stops the candidate
    slow_first_step_factor: float = 8.0
    #: ... provided it also took at least this long (first steps of tiny models are all noise)
    slow_first_step_floor_s: float = 0.5
    #: a later step this many times slower than the best steady step so far stops the candidate
    slow_step_factor: float = 20.0
    measure: MeasureSettings = MeasureSettings()


def plan() -> tuple[list[Candidate], dict[str, str]]:
    """Every device x precision worth measuring here, baseline first, and why other backends offer none."""
    candidates: list[Candidate] = []
    notes: dict[str, str] = {}
    for backend in all_backends():
        reason = backend.unusable_reason()
        if reason is not None:
            notes[backend.name] = reason
            continue
        for device in backend.devices():
            candidates += [Candidate(device=device, precision=p) for p in backend.precisions(device)]
    candidates.sort(key=lambda c: c != BASELINE)
    return candidates, notes


def unverified(reference_failure: Failure) -> Failure:
    """Without the fp32 CPU reference nothing can be verified: say so instead of guessing."""
    return Failure(kind="error", detail=f"not verified: the fp32 CPU reference failed ({reference_failure.kind})")


class CandidateFailed(Exception):
    def __init__(self, failure: Failure, **extra: Any) -> None:
        super().__init__(failure.detail)
        self.failure = failure
        self.extra = extra


def classify(exc: BaseException, backend: Backend) -> Failure:
    """An exception raised by a candidate's step, as a failure class with a human detail."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first_line = text.splitlines()[0][:300] if text else type(exc).__name__
    if backend.is_oom(exc):
        return Failure(kind="oom", detail=first_line)
    if isinstance(exc, NotImplementedError) or "not implemented for" in text or "not supported" in text.lower():
        return Failure(kind="unsupported", detail=first_line)
    return Failure(kind="error", detail=first_line)


class _FamilyRun:
    """Set-up and verification state shared by one family's candidates: the reference, the best times."""

    def __init__(self, family: Family, settings: Settings) -> None:
        self.family = family
        self.settings = settings
        self.reference: Trajectory | None = None
        self.best_first: dict[str, tuple[float, Candidate]] = {}
        self.best_step_s = float("inf")

    def check(self, step: TrainStep) -> Trajectory:
        """The verification window, which doubles as warm-up; stops a pathologically slow candidate early."""
        trajectory = Trajectory()
        device = step.candidate.device
        for index in range(self.settings.verify_steps):
            started = time.perf_counter()
            loss, grad_norm, skipped = step.run_checked()
            elapsed = time.perf_counter() - started
            trajectory.losses.append(loss)
            trajectory.grad_norms.append(grad_norm)
            trajectory.skipped.append(skipped)
            trajectory.step_s.append(elapsed)
            best_first_s, best_candidate = self.best_first.get(device, (float("inf"), step.candidate))
            if index == 0 and elapsed > max(
                self.settings.slow_first_step_factor * best_first_s, self.settings.slow_first_step_floor_s
            ):
                raise CandidateFailed(
                    Failure(kind="too_slow", detail=(
                        f"{_human_s(elapsed)}/step, {elapsed / best_first_s:.0f}x slower than "
                        f"{best_candidate.precision}'s first step; stopped after 1 step")),
                    first_step_ms=1000 * elapsed,
                )
            if index > 0 and elapsed > self.settings.slow_step_factor * self.best_step_s:
                raise CandidateFailed(
                    Failure(kind="too_slow", detail=(
                        f"{_human_s(elapsed)}/step, {elapsed / self.best_step_s:.0f}x slower than the fastest "
                        f"candidate so far; stopped after {index + 1} steps")),
                    first_step_ms=1000 * trajectory.step_s[0],
                )
        trajectory.update = step.update()
        return trajectory

    def set_up(self, candidate: Candidate) -> tuple[TrainStep, CandidateResult, list[float]]:
        """Build, verify (retrying lower GradScaler scales for fp16) and return a step ready for timing."""
        backend = backend_for(candidate.device)
        default_skipped: int | None = None
        scales = INIT_SCALES if candidate.precision == "fp16-mixed" else (None,)
        for init_scale in scales:
            backend.reset_peak_memory(candidate.device)
            step = TrainStep(self.family, candidate, backend, seed=self.settings.seed, init_scale=init_scale)
            trajectory = self.check(step)
            finite_losses = all(map(_finite, trajectory.losses))
            if trajectory.skipped_steps and finite_losses and init_scale != scales[-1]:
                default_skipped = trajectory.skipped_steps if default_skipped is None else default_skipped
                continue  # a lower scale may fix gradient overflow; it cannot fix a forward overflow
            break
        setup_s = step.build_s + trajectory.step_s[0]
        if trajectory.step_s[0] < self.best_first.get(candidate.device, (float("inf"),))[0]:
            self.best_first[candidate.device] = (trajectory.step_s[0], candidate)
        if self.reference is None:
            self.reference = trajectory  # the baseline runs first: fp32 on the CPU
        numerics, problem = compare(
            trajectory, self.reference, candidate.precision, init_scale=step.init_scale,
            default_scale_skipped=default_skipped,
        )
        steady = trajectory.step_s[1:] or trajectory.step_s
        result = CandidateResult(
            candidate=candidate,
            setup_s=setup_s,
            first_step_ms=1000 * trajectory.step_s[0],
            numerics=numerics,
            num_threads=torch.get_num_threads(),
            device_name=backend.device_name(candidate.device),
            peak_bytes=backend.peak_memory_bytes(candidate.device),
        )
        if problem is not None:
            raise CandidateFailed(Failure(kind="numerics", detail=problem), **_partial(result))
        self.best_step_s = min(self.best_step_s, _stats.median(steady))
        return step, result, steady


def _partial(result: CandidateResult) -> dict[str, Any]:
    return result.model_dump(exclude={"candidate", "failure", "timing"}, mode="json")


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def _human_s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.1f} ms"


def warm_process() -> None:
    """Pay the process's one-time costs before any candidate's set-up is timed.

    The first optimizer a process creates imports torch's compiler stack (about 1 s here), and the first
    backward starts autograd's engine; charged to the baseline's set-up, they would make the CPU look
    expensive for short jobs.
    """
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters())
    torch.nn.functional.relu(layer(torch.ones(2, 4))).sum().backward()
    optimizer.step()


class _Control:
    """A fixed pure-Python workload: no candidate, thread setting or device can change its speed."""

    def run(self) -> None:
        total = 0
        for i in range(20_000):
            total += i * i
        self.last = total


def calibrate_family(
    family: Family, candidates: list[Candidate] | None, settings: Settings, emit: Emit,
    *, discard_on_device_error: bool = True,
) -> None:
    """Measure ``family`` on ``candidates`` (planned here when None) and emit every result."""
    if candidates is None:
        candidates, notes = plan()
        emit({"event": "plan", "candidates": [c.model_dump() for c in candidates], "backend_notes": notes})
    run = _FamilyRun(family, settings)
    ready: dict[Candidate, TrainStep] = {}
    results: dict[Candidate, CandidateResult] = {}
    recent_s: dict[Candidate, list[float]] = {}
    reference_failure: Failure | None = None
    for index, candidate in enumerate(candidates):
        emit({"event": "begin", "candidate": candidate.model_dump(), "phase": "setup",
              "fraction": 0.5 * index / len(candidates)})
        extra: dict[str, Any] = {}
        try:
            if reference_failure is not None:
                raise CandidateFailed(unverified(reference_failure))
            step, result, recent_s[candidate] = run.set_up(candidate)
        except CandidateFailed as failed:
            failure, extra = failed.failure, failed.extra
        except Exception as exc:  # noqa: BLE001 - every failure is recorded with its class, never swallowed
            failure = classify(exc, backend_for(candidate.device))
        else:
            ready[candidate] = step
            results[candidate] = result
            continue
        emit({"event": "failed", "candidate": candidate.model_dump(), "failure": failure.model_dump(), "extra": extra})
        if candidate == BASELINE:
            reference_failure = failure
        elif candidate.device != "cpu" and discard_on_device_error and failure.kind not in ("numerics", "too_slow"):
            return  # a device error can leave the context poisoned: this worker must not measure anything else
    if not ready:
        emit({"event": "done", "results": [], "control_ms": [], "noisy": False})
        return

    def on_round(round_index: int, key: Candidate | None) -> None:
        if key is not None:
            fraction = 0.5 + 0.5 * min(1.0, round_index / settings.measure.max_rounds)
            emit({"event": "begin", "candidate": key.model_dump(), "phase": "timing", "fraction": fraction})

    clock = time.perf_counter
    estimates = {
        candidate: _stats.median(warm_up(step, clock, recent_s[candidate], settings.measure)[-3:])
        for candidate, step in ready.items()
    }
    timed = interleave(
        ready, estimate_s=estimates, control=_Control(), clock=clock, settings=settings.measure,
        labels=lambda c: c.label, on_round=on_round,
    )
    baseline_series = timed.series.get(BASELINE)
    final = []
    for candidate, series in timed.series.items():
        vs_baseline = None
        if baseline_series is not None and candidate != BASELINE:
            estimate, low, high = _stats.ratio_interval(series.round_ms, baseline_series.round_ms)
            vs_baseline = Interval(estimate=estimate, low=low, high=high)
        timing = Timing(
            round_ms=series.round_ms, steps_per_round=series.steps_per_round,
            median_ms=_stats.median(series.round_ms), spread=_stats.spread(series.round_ms),
            vs_baseline=vs_baseline,
        )
        final.append(results[candidate].model_copy(update={"timing": timing}).model_dump(mode="json"))
    emit({"event": "done", "results": final, "control_ms": timed.control_ms, "noisy": timed.noisy})


__all__ = ["BASELINE", "Settings", "calibrate_family", "classify", "plan", "unverified", "warm_process"]
