"""One candidate made ready for timing: built, verified against the fp32 CPU reference, warmed up.

The verification window (the first ``verify_steps`` steps from the same seed and batch as the reference)
doubles as the warm-up, and stops a pathologically slow candidate early (fp16 autocast on a CPU without fp16
kernels): before its first step when a probe on a slice of the batch is already that
slow, else inside the step past the step's limit (:mod:`~autotune._lab.probe`). fp16 is retried at
lower GradScaler scales while steps are skipped.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass

import torch

from autotune import _stats, _variants
from autotune._apply import fp32 as _fp32
from autotune._families import Family
from autotune._lab.copies import Load, Loaded
from autotune._lab.measure import Steppable
from autotune._lab.plan import BASELINE
from autotune._lab.probe import Overtime, Probe, TooSlow, deadline
from autotune._lab.protocol import CalibrationSettings
from autotune._lab.step import TrainStep, start_device
from autotune._lab.verify import INIT_SCALES, Trajectory, compare
from autotune._records import Candidate, CandidateResult, Failure
from autotune._variants import Facts
from autotune.backends import Backend, ClockReading, backend_for


@dataclass
class Prepared:
    """A verified candidate, ready to time: its step, its result so far, its recent step times, its facts."""

    step: Steppable
    result: CandidateResult
    recent_s: list[float]
    facts: Facts


class CandidateFailed(Exception):
    """A candidate cannot be used; ``result`` carries the failure and whatever was measured before it."""

    def __init__(self, result: CandidateResult) -> None:
        assert result.failure is not None
        super().__init__(result.failure.detail)
        self.result = result


def failed(candidate: Candidate, kind: str, detail: str, **measured: float | None) -> CandidateFailed:
    return CandidateFailed(CandidateResult.model_validate(
        {"candidate": candidate, "failure": Failure.model_validate({"kind": kind, "detail": detail}), **measured}))


def unverified(reference_failure: Failure) -> Failure:
    """Without the fp32 CPU reference nothing can be verified: say so instead of guessing."""
    return Failure(kind="error", detail=f"not verified: the fp32 CPU reference failed ({reference_failure.kind})")


def classify(exc: BaseException, device: str) -> Failure:
    """An exception raised by a candidate's step, as a failure class with a human detail."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first_line = text.splitlines()[0][:300] if text else type(exc).__name__
    if backend_for(device).is_oom(exc):
        return Failure(kind="oom", detail=first_line)
    if isinstance(exc, NotImplementedError) or "not implemented for" in text or "not supported" in text.lower():
        return Failure(kind="unsupported", detail=first_line)
    return Failure(kind="error", detail=first_line)


def warm_process() -> None:
    """Pay the process's one-time costs before any candidate's set-up is timed.

    The first optimizer a process creates imports torch's compiler stack (a second or more), and the first
    backward starts autograd's engine; charged to the baseline's set-up, they would make the CPU look
    expensive for short jobs.
    """
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters())
    torch.nn.functional.relu(layer(torch.ones(2, 4))).sum().backward()
    optimizer.step()


class TorchLab:
    """Sets up one family's candidates with real torch; remembers the reference and the best times so far."""

    def __init__(self, family: Family, settings: CalibrationSettings, *, probe: bool = True,
                 copies: Load | None = None) -> None:
        """``probe``: probe each new precision on the CPU before its first full step (not for the canary,
        whose candidates passed when calibrated). ``copies``: the other processes of a job, which run each CPU
        candidate's step alongside its timed steps (its verification runs alone)."""
        self.family = family
        self.settings = settings
        self.copies = copies
        self.reference: Trajectory | None = None
        self.best_first: dict[str, tuple[float, Candidate]] = {}
        #: each device's start-up (context, allocator), timed once and charged to every candidate on it: the
        #: user pays it whichever candidate they run, so it must not skew a comparison between them
        self.device_start_s: dict[str, float] = {}
        self.best_step_s = float("inf")
        self.default_threads = torch.get_num_threads()
        #: the host's fp32 settings (the worker starts with them): what mixed-precision candidates run with
        self.fp32_host = _fp32.current()
        self.probe = Probe(family, seed=settings.seed, fp32_host=self.fp32_host,
                           factor=settings.slow_first_step_factor) if probe else None

    def set_up(self, candidate: Candidate) -> Prepared:
        """Build, verify (retrying lower GradScaler scales for fp16); raises CandidateFailed."""
        backend = backend_for(candidate.device)
        if candidate.device not in self.device_start_s:
            self.device_start_s[candidate.device] = start_device(backend, candidate.device)
        probe_s = self._probe(candidate, backend)
        default_skipped: int | None = None
        scales = INIT_SCALES if _variants.precision_row(candidate.precision).grad_scaler else (None,)
        for init_scale in scales:
            backend.reset_peak_memory(candidate.device)
            step = TrainStep(self.family, candidate, backend, seed=self.settings.seed, fp32_host=self.fp32_host,
                             init_scale=init_scale)
            if self.probe is not None:
                self.probe.size(step.inputs)
            with step.selected():
                trajectory = self._check(step)
            if trajectory.skipped_steps and all(map(_finite, trajectory.losses)) and init_scale != scales[-1]:
                default_skipped = trajectory.skipped_steps if default_skipped is None else default_skipped
                continue  # a lower scale may fix gradient overflow; it cannot fix a forward overflow
            break
        if trajectory.step_s[0] < self.best_first.get(candidate.device, (float("inf"),))[0]:
            self.best_first[candidate.device] = (trajectory.step_s[0], candidate)
        result = self._result(step, backend, trajectory, default_skipped, probe_s)
        if result.failure is not None:
            raise CandidateFailed(result)
        steady = trajectory.step_s[1:] or trajectory.step_s
        self.best_step_s = min(self.best_step_s, _stats.median(steady))
        timed: Steppable = step
        if self.copies is not None and candidate.device == _variants.CPU:
            timed = Loaded(step, candidate, self.copies)
        return Prepared(timed, result, steady, step.facts)

    def _probe(self, candidate: Candidate, backend: Backend) -> float:
        """Stop a new precision on the CPU whose probe is already far too slow, before its first full step
        (only where that step's limit is above the floor: a full step could cost seconds). Returns the set-up
        seconds the probe took from it (its first pass's excess over its second)."""
        fastest = self.best_first.get(candidate.device)
        if (self.probe is None or candidate.device != _variants.CPU or candidate != candidate.base or fastest is None
                or _variants.compiles(fastest[1])
                or self.settings.slow_first_step_factor * fastest[0] <= self.settings.slow_step_floor_s):
            return 0.0
        try:
            return self.probe.check(candidate, backend, fastest[1], self.settings.slow_first_step_factor * fastest[0])
        except TooSlow as exc:
            raise failed(candidate, "too_slow", str(exc)) from None

    def clock_check(self, device: str) -> str | None:
        """None where the device's backend reads its throttle reasons (an NVIDIA GPU with NVML); else why not."""
        return backend_for(device).clock_check(device)

    def clock_reading(self, device: str) -> ClockReading | None:
        """The device's clock now and the throttle reasons in force, where its backend reads them."""
        return backend_for(device).clock_reading(device)

    def release(self, candidates: list[Candidate]) -> None:
        """The session dropped its steps: collect them and hand the devices' cached blocks back."""
        gc.collect()
        for device in dict.fromkeys(c.device for c in candidates):
            backend_for(device).release_cached_memory(device)
        if self.copies is not None:
            self.copies.release([c for c in candidates if c.device == _variants.CPU])

    def _result(self, step: TrainStep, backend: Backend, trajectory: Trajectory,
                default_skipped: int | None, probe_s: float) -> CandidateResult:
        candidate = step.candidate
        numerics, problem = None, None
        if self.settings.verify:
            if self.reference is None and candidate == BASELINE:
                self.reference = trajectory  # the baseline runs first: fp32 on the CPU
            if self.reference is not None:
                numerics, problem = compare(trajectory, self.reference, candidate.precision,
                                            init_scale=step.init_scale, default_scale_skipped=default_skipped)
        return CandidateResult(
            candidate=candidate,
            failure=None if problem is None else Failure(kind="numerics", detail=problem),
            setup_s=self.device_start_s[candidate.device] + probe_s + step.build_s + trajectory.step_s[0],
            first_step_ms=1000 * trajectory.step_s[0],
            numerics=numerics,
            num_threads=candidate.num_threads or self.default_threads,
            device_name=backend.device_name(candidate.device),
            peak_bytes=backend.peak_memory_bytes(candidate.device),
            peak_reserved_bytes=backend.peak_reserved_bytes(candidate.device),
        )

    def _limit_s(self, index: int, candidate: Candidate) -> float | None:
        """How long verification step ``index`` may take before it is stopped inside (None: no limit yet)."""
        if _variants.compiles(candidate):
            return None  # compiling is the first step's job, and global module hooks would change the graph
        if index == 0:
            best_first_s = self.best_first.get(candidate.device, (float("inf"), candidate))[0]
            if best_first_s == float("inf"):
                return None  # nothing to compare with yet
            return max(self.settings.slow_first_step_factor * best_first_s, self.settings.slow_step_floor_s)
        if self.best_step_s == float("inf"):
            return None
        return max(self.settings.slow_step_factor * self.best_step_s, self.settings.slow_step_floor_s)

    def _limit_basis(self, index: int) -> str:
        if index == 0:
            return f"{self.settings.slow_first_step_factor:.0f}x this device's fastest first step"
        return f"{self.settings.slow_step_factor:.0f}x the fastest step so far"

    def _check(self, step: TrainStep) -> Trajectory:
        """The verification window, which doubles as warm-up; stops a pathologically slow candidate early."""
        trajectory = Trajectory()
        candidate = step.candidate
        is_reference = self.reference is None and candidate == BASELINE
        steps = self.settings.verify_steps if candidate == candidate.base else self.settings.variant_verify_steps
        for index in range(steps):
            limit_s = self._limit_s(index, candidate)
            started = time.perf_counter()
            try:
                with deadline(limit_s) if limit_s is not None else contextlib.nullcontext():
                    if self.settings.verify:
                        loss, grad_norm, skipped = step.run_checked()
                        trajectory.losses.append(loss)
                        trajectory.grad_norms.append(grad_norm)
                        trajectory.skipped.append(skipped)
                    else:
                        step.run()
            except Overtime:
                elapsed = time.perf_counter() - started
                first = trajectory.step_s[0] if trajectory.step_s else elapsed
                raise failed(candidate, "too_slow", (
                    f"over {_human_s(elapsed)} into step {index + 1} (the limit: {_human_s(limit_s or 0.0)}, "
                    f"{self._limit_basis(index)}); stopped inside the step"), first_step_ms=1000 * first) from None
            elapsed = time.perf_counter() - started
            if self.settings.verify and is_reference and index + 1 == self.settings.variant_verify_steps:
                trajectory.early_updates[index + 1] = step.update()
            trajectory.step_s.append(elapsed)
            best_first_s, best = self.best_first.get(candidate.device, (float("inf"), candidate))
            if index == 0 and not _variants.compiles(candidate) and elapsed > max(
                self.settings.slow_first_step_factor * best_first_s, self.settings.slow_step_floor_s
            ):
                raise failed(candidate, "too_slow", (
                    f"{_human_s(elapsed)}/step, {elapsed / best_first_s:.0f}x slower than {best.precision}'s "
                    "first step; stopped after 1 step"), first_step_ms=1000 * elapsed)
            if index > 0 and elapsed > max(self.settings.slow_step_factor * self.best_step_s,
                                           self.settings.slow_step_floor_s):
                raise failed(candidate, "too_slow", (
                    f"{_human_s(elapsed)}/step, {elapsed / self.best_step_s:.0f}x slower than the fastest "
                    f"candidate so far; stopped after {index + 1} steps"), first_step_ms=1000 * trajectory.step_s[0])
        if self.settings.verify:
            trajectory.update = step.update()
        return trajectory


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def _human_s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.1f} ms"


__all__ = ["CandidateFailed", "Prepared", "TorchLab", "classify", "failed", "unverified", "warm_process"]
