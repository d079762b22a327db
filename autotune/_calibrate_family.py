"""Calibrate one model family: plan, set up and verify each candidate, time the survivors, refine the leader.

This runs inside the calibration worker (or, in the unsafe in-process mode, in the host). It reports through
``emit``, one JSON-able event at a time, so a native crash loses only the candidate in flight. The search is
staged: precisions, then layout and optimizer variants of the leader, then combinations and CPU threads.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autotune import _fp32, _stats
from autotune._decide import pick_fastest, step_ratio
from autotune._env import Search
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
    #: the first steps of every candidate, checked against the fp32 CPU reference; they also warm it up
    verify_steps: int = 8
    #: False runs the same steps unchecked: only benchmarks/overheads.py uses it, to price the numerics gate
    verify: bool = True
    #: a first step this many times slower than the same device's best first step stops the candidate
    slow_first_step_factor: float = 8.0
    #: ... provided it also took at least this long (first steps of tiny models are all noise)
    slow_first_step_floor_s: float = 0.5
    #: a later step this many times slower than the best steady step so far stops the candidate
    slow_step_factor: float = 20.0
    #: a variant (search stage 2 or 3) this many times slower than the leader after 3 steps is pruned
    variant_prune_factor: float = 1.3
    #: each later search stage's timing budget, as a share of the family's budget
    variant_budget_share: float = 0.2
    #: ... and its most rounds: a variant that cannot show a clear gain by then ties, and the plainer one wins
    variant_max_rounds: int = 8
    #: "precision": device x precision only; "default": also layout, optimizer and CPU threads, staged;
    #: "extended": also torch.compile (compile time counts as set-up: tens of seconds per candidate)
    search: Search = "default"
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


def fewer_threads() -> list[int]:
    """CPU thread counts worth trying below torch's default, e.g. ``[1]`` on 2 cores, ``[1, 4]`` on 8."""
    default = torch.get_num_threads()
    return sorted({1, default // 2} - {0, default})


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
        #: in later search stages, the leader a variant must keep up with, and its step time
        self.incumbent: tuple[Candidate, float] | None = None
        #: the host's fp32 settings (the worker starts with them): what mixed-precision candidates run with
        self.fp32_host = _fp32.current()

    def check(self, step: TrainStep) -> Trajectory:
        """The verification window, which doubles as warm-up; stops a pathologically slow candidate early."""
        trajectory = Trajectory()
        device = step.candidate.device
        for index in range(self.settings.verify_steps):
            started = time.perf_counter()
            if self.settings.verify:
                loss, grad_norm, skipped = step.run_checked()
                trajectory.losses.append(loss)
                trajectory.grad_norms.append(grad_norm)
                trajectory.skipped.append(skipped)
            else:
                step.run()
            elapsed = time.perf_counter() - started
            trajectory.step_s.append(elapsed)
            best_first_s, best_candidate = self.best_first.get(device, (float("inf"), step.candidate))
            if index == 0 and not step.candidate.compiled and elapsed > max(
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
            if self.incumbent is not None and index >= 2:
                steady_s = _stats.median(trajectory.step_s[1:])
                incumbent, incumbent_s = self.incumbent
                if steady_s > self.settings.variant_prune_factor * incumbent_s:
                    raise CandidateFailed(
                        Failure(kind="too_slow", detail=(
                            f"{1000 * steady_s:.3g} ms/step, {steady_s / incumbent_s:.2f}x slower than the leader "
                            f"{incumbent.label}; pruned after {index + 1} steps")),
                        first_step_ms=1000 * trajectory.step_s[0],
                    )
        if self.settings.verify:
            trajectory.update = step.update()
        return trajectory

    def set_up(self, candidate: Candidate) -> tuple[TrainStep, CandidateResult, list[float]]:
        """Build, verify (retrying lower GradScaler scales for fp16) and return a step ready for timing."""
        backend = backend_for(candidate.device)
        default_skipped: int | None = None
        scales = INIT_SCALES if candidate.precision == "fp16-mixed" else (None,)
        for init_scale in scales:
            backend.reset_peak_memory(candidate.device)
            step = TrainStep(self.family, candidate, backend, seed=self.settings.seed, fp32_host=self.fp32_host,
                             init_scale=init_scale)
            trajectory = self.check(step)
            finite_losses = all(map(_finite, trajectory.losses))
            if trajectory.skipped_steps and finite_losses and init_scale != scales[-1]:
                default_skipped = trajectory.skipped_steps if default_skipped is None else default_skipped
                continue  # a lower scale may fix gradient overflow; it cannot fix a forward overflow
            break
        setup_s = step.build_s + trajectory.step_s[0]
        if trajectory.step_s[0] < self.best_first.get(candidate.device, (float("inf"),))[0]:
            self.best_first[candidate.device] = (trajectory.step_s[0], candidate)
        numerics, problem = None, None
        if self.settings.verify:
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
            num_threads=candidate.threads or torch.get_num_threads(),
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


class _Session:
    """One worker's pass over a family: candidates set up once, then timed in one or more stages."""

    def __init__(self, family: Family, settings: Settings, emit: Emit, discard_on_device_error: bool) -> None:
        self.run = _FamilyRun(family, settings)
        self.settings = settings
        self.emit = emit
        self.discard_on_device_error = discard_on_device_error
        self.ready: dict[Candidate, TrainStep] = {}
        self.results: dict[Candidate, CandidateResult] = {}
        self.recent_s: dict[Candidate, list[float]] = {}
        self.reference_failure: Failure | None = None
        self.poisoned = False
        self.control: list[float] = []
        self.notes: list[str] = []

    def set_up(self, candidates: list[Candidate], share: tuple[float, float]) -> list[Candidate]:
        """Build and verify each candidate; returns those ready to time. Failures are emitted as they happen."""
        ready = []
        for index, candidate in enumerate(candidates):
            if self.poisoned:
                break
            fraction = share[0] + (share[1] - share[0]) * index / len(candidates)
            self.emit({"event": "begin", "candidate": candidate.model_dump(), "phase": "setup", "fraction": fraction})
            extra: dict[str, Any] = {}
            try:
                if self.reference_failure is not None:
                    raise CandidateFailed(unverified(self.reference_failure))
                step, result, self.recent_s[candidate] = self.run.set_up(candidate)
            except CandidateFailed as failed:
                failure, extra = failed.failure, failed.extra
            except Exception as exc:  # noqa: BLE001 - every failure is recorded with its class, never swallowed
                failure = classify(exc, backend_for(candidate.device))
            else:
                self.ready[candidate] = step
                self.results[candidate] = result
                ready.append(candidate)
                continue
            self.emit({"event": "failed", "candidate": candidate.model_dump(), "failure": failure.model_dump(),
                       "extra": extra})
            if candidate == BASELINE:
                self.reference_failure = failure
            elif candidate.device != "cpu" and self.discard_on_device_error and failure.kind not in ("numerics", "too_slow"):
                self.poisoned = True  # a device error can leave the context poisoned: measure nothing else here
        return ready

    def time(self, candidates: list[Candidate], stage: int, share: tuple[float, float]) -> Candidate:
        """Interleave ``candidates``; record their timings (a later stage replaces an earlier one); the leader."""
        settings = self.settings.measure
        if stage > 1:  # variants refine a decision already made: a share of the budget, and fewer rounds
            settings = dataclasses.replace(
                settings, budget_s=settings.budget_s * self.settings.variant_budget_share,
                max_rounds=min(settings.max_rounds, self.settings.variant_max_rounds),
            )

        def on_round(round_index: int, key: Candidate | None) -> None:
            if key is not None:
                fraction = share[0] + (share[1] - share[0]) * min(1.0, round_index / settings.max_rounds)
                self.emit({"event": "begin", "candidate": key.model_dump(), "phase": "timing", "fraction": fraction})

        clock = time.perf_counter
        estimates = {
            c: _stats.median(warm_up(self.ready[c], clock, self.recent_s[c], settings)[-3:]) for c in candidates
        }
        timed = interleave(
            {c: self.ready[c] for c in candidates}, estimate_s=estimates, control=_Control(), clock=clock,
            settings=settings, labels=lambda c: c.label, on_round=on_round,
        )
        self.control += timed.control_ms
        for candidate, series in timed.series.items():
            timing = Timing(
                round_ms=series.round_ms, steps_per_round=series.steps_per_round,
                median_ms=_stats.median(series.round_ms), spread=_stats.spread(series.round_ms),
                stage=stage, dropped=series.dropped,
            )
            self.results[candidate] = self.results[candidate].model_copy(update={"timing": timing})
        leader = pick_fastest([self.results[c] for c in candidates], None).candidate
        self.run.incumbent = (leader, _stats.median(timed.series[leader].round_ms) / 1000)
        return leader

    def variants(self, leader: Candidate, stage: int) -> list[Candidate]:
        """Stage 2: layout and optimizer variants of the leader. Stage 3: what else helped, and CPU threads."""
        step = self.ready[leader]
        found: list[Candidate] = []
        if stage == 2:
            if step.image_inputs and leader.memory_format == "contiguous":
                found.append(leader.model_copy(update={"memory_format": "channels_last"}))
            if step.default_optimizer and leader.optimizer == "default":
                found.append(leader.model_copy(update={"optimizer": "fused"}))
            if self.settings.search == "extended" and not leader.compiled:
                found.append(leader.model_copy(update={"compiled": True}))
            return found
        # Stage 3: a stage-2 variant that also beat the plain leader combines with the new one.
        base_ms = self._median(leader.base)
        for other in self.results:
            if other.base == leader.base and other != leader and other.threads is None and base_ms is not None:
                other_ms = self._median(other)
                if other_ms is not None and other_ms < base_ms:
                    combined = leader.model_copy(update={
                        "memory_format": "channels_last" if "channels_last" in (leader.memory_format, other.memory_format) else "contiguous",
                        "optimizer": other.optimizer if other.optimizer != "default" else leader.optimizer,
                        "compiled": leader.compiled or other.compiled,
                    })
                    if combined not in self.results and combined not in found:
                        found.append(combined)
        if leader.device == "cpu":
            found += [leader.model_copy(update={"threads": count}) for count in fewer_threads()]
        return found

    def _median(self, candidate: Candidate) -> float | None:
        result = self.results.get(candidate)
        return result.timing.median_ms if result is not None and result.timing is not None else None


def _with_baseline_ratios(results: dict[Candidate, CandidateResult]) -> list[CandidateResult]:
    """Each timed candidate's step-time ratio to fp32 on the CPU, paired when timed in the same stage."""
    baseline = results.get(BASELINE)
    if baseline is None or baseline.timing is None:
        return list(results.values())
    out = []
    for candidate, result in results.items():
        if result.timing is not None and candidate != BASELINE:
            estimate, low, high = step_ratio(result, baseline)
            vs_baseline = Interval(estimate=estimate, low=low, high=high)
            result = result.model_copy(update={"timing": result.timing.model_copy(update={"vs_baseline": vs_baseline})})
        out.append(result)
    return out


def calibrate_family(
    family: Family, candidates: list[Candidate] | None, settings: Settings, emit: Emit,
    *, discard_on_device_error: bool = True,
) -> None:
    """Measure ``family`` and emit every result.

    With ``candidates=None`` the search is planned here and staged: precisions first (stage 1), then layout and
    optimizer variants of the leader (stage 2), then combinations and CPU threads (stage 3); each stage keeps
    its leader and prunes with the same interleaved statistics. A restarted worker gets the remaining
    candidates explicitly and times them in one stage.
    """
    staged = candidates is None
    if candidates is None:
        candidates, notes = plan()
        emit({"event": "plan", "candidates": [c.model_dump() for c in candidates], "backend_notes": notes})
    session = _Session(family, settings, emit, discard_on_device_error)
    stages = 3 if staged and settings.search != "precision" else 1
    share = 1.0 / stages
    ready = session.set_up(candidates, (0.0, 0.5 * share))
    if ready:
        leader = session.time(ready, 1, (0.5 * share, share))
        for stage in range(2, stages + 1):
            if session.poisoned:
                break
            variants = session.variants(leader, stage)
            if not variants:
                continue
            lo = (stage - 1) * share
            emit({"event": "plan", "candidates": [c.model_dump() for c in variants], "backend_notes": None})
            tried = session.set_up(variants, (lo, lo + 0.5 * share))
            session.notes.append(
                f"stage {stage}: " + ", ".join(v.label for v in variants) + f" against the leader {leader.label}"
            )
            if tried:
                leader = session.time([leader, *tried], stage, (lo + 0.5 * share, lo + share))
            ready += tried
    if session.poisoned:
        return
    emit({
        "event": "done",
        "results": [r.model_dump(mode="json") for r in _with_baseline_ratios(session.results)],
        "control_ms": session.control, "search_notes": session.notes,
        # Judged over every stage's rounds together, the same series the warning quotes.
        "noisy": _stats.drift(session.control) > settings.measure.noise_limit,
    })


__all__ = ["BASELINE", "Settings", "calibrate_family", "classify", "fewer_threads", "plan", "unverified", "warm_process"]
