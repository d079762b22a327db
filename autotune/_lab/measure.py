"""Interleaved, sequential timing of candidates that already passed set-up and verification.

Each round runs every active candidate once, in a fresh seeded random order, so drift and position effects hit
all alike; at each of ``_stats.LOOKS`` the paired intervals drop, outpace and settle candidates (``looks``).
Timing stops when nothing is open or at the first look past the budget, but the final comparison times the
pick's open pairs on, up to ``overrun`` x the budget. A busy machine (:func:`noise`: what the operating system
says other processes took, or a control workload whose level moved well past its own noise) doubles the budget
and flags the result. On an asynchronous device a candidate whose steps overlap (``overlaps``) is timed in spans
(``per_step_s``). The clock, the steps and the operating system's view are injected (``Clock``, ``Steppable``,
``Watch``).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

from autotune import _stats
from autotune._lab.looks import Comparisons, Dropped, K, Series, drop_far_behind, look
from autotune._records import MachineLoad, NoiseCause


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds from an arbitrary origin (``time.perf_counter``)."""


class Steppable(Protocol):
    #: steps are queued to a device and run while the host launches the next ones (CUDA, XPU, MPS): a training
    #: loop synchronises rarely, so launch time and device time overlap
    asynchronous: bool

    def run(self, steps: int = 1) -> None:
        """``steps`` training steps back to back, synchronised once after the last."""

    def selected(self) -> contextlib.AbstractContextManager[None]:
        """Process-wide settings of this candidate (its thread count), applied outside the timed steps."""


class Window(Protocol):
    def so_far(self) -> MachineLoad | None:
        """What the operating system saw since the window opened (None: it says nothing)."""

    def close(self) -> MachineLoad | None:
        """... over the whole window, with the other processes that took the most."""


class Watch(Protocol):
    def open(self) -> Window:
        """A timing window, from now."""

    def wait_for_host(self) -> float:
        """Wait until the worker's host is done with its own start-up (once); the seconds waited."""


class Unwatched:
    """No view of the operating system: the control alone can flag a result (a fake clock, a test)."""

    def open(self) -> Unwatched:
        return self

    def so_far(self) -> None:
        return None

    def close(self) -> None:
        return None

    def wait_for_host(self) -> float:
        return 0.0


class MeasureSettings(BaseModel):
    """Knobs of one timing stage; defaults suit a 2-core laptop as well as a workstation GPU."""

    model_config = ConfigDict(frozen=True)

    budget_s: float = 8.0
    #: a look of the sequential test (``_stats.LOOKS``): the last round timing may run to
    max_rounds: int = _stats.LOOKS[-1]
    #: seeds the order of the candidates in each round
    order_seed: int = 0
    #: each candidate's share of a round lasts at least this long, so timer noise stays negligible
    round_min_s: float = 0.003
    #: the control's level may move this much between the halves of its rounds (``_stats.level_shift``), and
    #: ``shift_noises`` times its own round-to-round noise, before the machine counts as busy
    shift_floor: float = 0.10
    shift_noises: float = 4.0
    #: ... as it does once other processes took this much CPU time during a timing window (in cores), or the
    #: hypervisor this share of the machine's
    busy_other_cores: float = 0.5
    busy_steal: float = 0.05
    #: a candidate this many times slower than its group's leader is dropped after a single round
    far_behind: float = 4.0
    #: ... and one this many times slower than another group's fastest is outpaced (no longer timed)
    far_behind_device: float = 4.0
    #: how far past its budget the final comparison may go to resolve the pick's open pairs (the cap)
    overrun: float = 4.0
    #: ... and the fewest rounds it gives them before that cap applies (a step of seconds: a few rounds)
    decisive_rounds: int = 10
    #: pause before each control measurement (``settle``: on the CPU, and on until the candidates' thread pools
    #: stop spinning)
    settle_s: float = 0.001
    #: past the first look, the control takes at most this share of the time: every round of heavy steps, every
    #: few of sub-millisecond steps, whose rounds it would otherwise almost double
    control_share: float = 0.25
    #: on an asynchronous device a sample spans at least this many steps between two synchronisations, once a
    #: span's steps proved this much faster than lone ones (``overlaps``)
    span_steps: int = 4
    overlap: float = 0.05
    #: ... for steps shorter than this (``overlaps``)
    span_check_s: float = 0.05
    warmup_max_steps: int = 8
    warmup_stable: float = 0.15
    #: a candidate timed again, after others ran (their caches, a GPU's clocks gone down), warms up afresh: its
    #: steady step time is known, so a fresh step must come this close to it
    warmup_stable_again: float = 0.05
    #: a device clock (where the device reports one) falling by more than this during the final comparison
    #: (throttling, which the CPU control cannot see) makes the result noisy
    clock_drop: float = 0.10

    @model_validator(mode="after")
    def _max_rounds_is_a_look(self) -> MeasureSettings:
        if self.max_rounds not in _stats.LOOKS:
            raise ValueError(f"max_rounds must be one of the looks {_stats.LOOKS}, not {self.max_rounds}")
        return self


@dataclass
class Interleaved(Generic[K]):
    series: dict[K, Series[K]]
    control_ms: list[float]
    noisy: bool
    rounds: int
    elapsed_s: float
    #: the final comparison stopped at its cap with a pair the pick rests on still open: the pick may be
    #: further from the best than its margin allows (a close call, or rounds wrecked by a busy machine)
    unresolved_gap: bool = False
    #: what the operating system saw during the rounds (None: it says nothing)
    load: MachineLoad | None = None


def noise(control_ms: list[float], loads: list[MachineLoad], settings: MeasureSettings) -> list[NoiseCause]:
    """Why timings taken beside this control and these windows are not the machine's own: other processes took
    ``busy_other_cores`` or more in a window, the hypervisor ``busy_steal`` of it, or the control's level moved
    past ``shift_floor`` and ``shift_noises`` times its own noise. Empty on a quiet machine."""
    causes: list[NoiseCause] = []
    if any(load.other_cores is not None and load.other_cores >= settings.busy_other_cores for load in loads):
        causes.append("other_processes")
    if any(load.steal is not None and load.steal >= settings.busy_steal for load in loads):
        causes.append("steal")
    if control_shifted(control_ms, settings):
        causes.append("control_shift")
    return causes


def control_shifted(control_ms: list[float], settings: MeasureSettings) -> bool:
    """The control's level moved past ``shift_floor`` and ``shift_noises`` times its own noise: the machine
    changed under the measurement (another program, a clock). Its own noise, however large, is not a shift."""
    shift, own = _stats.level_shift(control_ms)
    return shift > max(settings.shift_floor, settings.shift_noises * own)


def timed(step: Steppable, clock: Clock, steps: int = 1) -> float:
    started = clock()
    step.run(steps)
    return clock() - started


def per_step_s(step: Steppable, clock: Clock, steps: int, *, spans: bool) -> list[float]:
    """Seconds per step, as a training loop sees them: each of ``steps`` steps on its own; or, ``spans``, a
    single figure, ``steps`` steps' worth of a span of ``steps + 1`` less a lone step. A span of k steps takes
    a + k x b (the queue's fill and drain, then one step's throughput b); the difference leaves b alone, where a
    span's mean would still carry a / k of launch or compute that a loop hides."""
    if not spans:
        return [timed(step, clock) for _ in range(steps)]
    one = timed(step, clock)
    span = timed(step, clock, steps + 1)
    return [(span - one) / steps if span > one else span / (steps + 1)]


def overlaps(step: Steppable, clock: Clock, lone_s: list[float], settings: MeasureSettings) -> bool:
    """Does a loop hide part of a lone step's time (its launches overlap the device's work)? Then it is timed in
    spans. A step whose time is the device's anyway is timed step by step: each its own sample, and a heavy
    tail then hits one step, not a span.

    ``lone_s``: its last lone steps (the warm-up's). A step of ``span_check_s`` or more keeps the device busy
    while its own kernels launch, and is not checked (a check costs steps). The best of those lone steps
    against one span; a yes is checked again on the best of three fresh lone steps and of two spans
    (interference only adds time, so a run of disturbed lone steps cannot fake an overlap)."""
    if not step.asynchronous or not lone_s or min(lone_s[-3:]) >= settings.span_check_s:
        return False
    k = settings.span_steps
    with step.selected():
        if timed(step, clock, k) / k >= (1 - settings.overlap) * min(lone_s[-3:]):
            return False
        fresh_s = min(timed(step, clock) for _ in range(3))
        return min(timed(step, clock, k) for _ in range(2)) / k < (1 - settings.overlap) * fresh_s


def warm_up(step: Steppable, clock: Clock, recent_s: list[float], settings: MeasureSettings, *,
            steady_s: float | None = None) -> list[float]:
    """Run extra steps until the last three agree within ``warmup_stable`` (allocator, JIT, kernel choice).

    A candidate timed before (``steady_s``: its step time then) warms up afresh, after other candidates ran
    (their caches, their allocations, a GPU's clocks gone down while idle): fresh steps until one is within
    ``warmup_stable_again`` of that steady time. Only a slower step is a warm-up, and a disturbed one is
    followed by another, where three steps that must agree would keep a busy machine stepping."""
    with step.selected():
        if steady_s is not None:
            times = [timed(step, clock)]
            while times[-1] > (1 + settings.warmup_stable_again) * steady_s and len(times) < settings.warmup_max_steps:
                times.append(timed(step, clock))
            return times
        times = list(recent_s)
        for _ in range(settings.warmup_max_steps):
            if len(times) >= 3 and _stats.relative_range(times[-3:]) <= settings.warmup_stable:
                break
            times.append(timed(step, clock))
    return times


def interleave(
    steps: Mapping[K, Steppable],
    *,
    estimate_s: Mapping[K, float],
    control: Steppable,
    clock: Clock,
    settings: MeasureSettings,
    comparisons: Comparisons[K],
    on_round: Callable[[int, K | None], None] | None = None,
    settle: Callable[[float], None] = time.sleep,
    answered: Callable[[Mapping[K, Series[K]]], bool] | None = None,
    spans: Mapping[K, bool] | None = None,
    watch: Watch | None = None,
) -> Interleaved[K]:
    """Time ``steps`` in interleaved rounds until every pair is resolved or the budget is spent (or, at a look,
    the caller's own question is ``answered``). ``spans``: the steps to time in spans (``overlaps``); ``watch``:
    the operating system's view of the rounds. ``settle`` pauses before each control measurement."""
    spans = {key: False for key in steps} if spans is None else spans
    series: dict[K, Series[K]] = {
        key: Series(steps_per_round=max(settings.span_steps if spans[key] else 1,
                                        math.ceil(settings.round_min_s / max(estimate_s[key], 1e-9))))
        for key in steps
    }
    active = list(steps)
    order = random.Random(settings.order_seed)
    for _ in range(3):
        control.run()  # the interpreter specialises a loop's bytecode on its first runs: not drift
    control_ms: list[float] = []
    window = (watch or Unwatched()).open()
    started = control_end = clock()
    control_s = 0.0
    rounds = 0
    contested: set[K] = set()
    paused = False
    while active:
        for key in order.sample(active, len(active)):
            if on_round is not None:
                on_round(rounds, key)
            with steps[key].selected():
                if paused and series[key].steps_per_round > 1 and not spans[key]:
                    steps[key].run()  # cheap steps: one untimed step wakes the threads the control's pause put asleep
                samples = per_step_s(steps[key], clock, series[key].steps_per_round, spans=spans[key])
            paused = False
            series[key].round_ms.append(1000 * _stats.median(samples))
        share = settings.control_share
        if rounds < _stats.LOOKS[0] or clock() - control_end >= control_s * (1 - share) / share:
            # The least disturbed of a few runs (interference only adds time), after a pause that lets the
            # candidates' OpenMP threads stop spinning: on a hyper-threaded core they would slow the control down.
            control_start = clock()
            settle(settings.settle_s)
            control_ms.append(1000 * min(timed(control, clock) for _ in range(3)))
            control_end = clock()
            control_s = control_end - control_start
            paused = True
        rounds += 1
        if rounds == 1:
            drop_far_behind(series, active, comparisons, estimate_s, far_behind=settings.far_behind,
                            far_behind_device=settings.far_behind_device)
        if rounds not in _stats.LOOKS and rounds < settings.max_rounds:
            continue
        timing = list(active)
        so_far = window.so_far()
        drifting = bool(noise(control_ms, [so_far] if so_far is not None else [], settings))
        budget_s = settings.budget_s * (2 if drifting else 1)
        contested = look(series, active, comparisons, rounds)
        if rounds >= settings.max_rounds or (answered is not None and answered(series)):
            break
        if drifting and rounds < 2 * _stats.LOOKS[0]:
            # A drifting machine gives every pair at least twice the first look's rounds before it settles.
            active[:] = [k for k in timing if series[k].dropped is None and series[k].outpaced is None]
        if not active:
            break
        elapsed_s = clock() - started
        if elapsed_s >= budget_s:
            # Past the budget, the final comparison times only the pick's open pairs, until they are resolved or
            # the cap (never below ``decisive_rounds`` for heavy steps): a pair left open there flags the result.
            capped = elapsed_s >= settings.overrun * settings.budget_s and rounds >= settings.decisive_rounds
            if not contested or capped:
                break
            active[:] = [k for k in active if k in contested]
    if on_round is not None:
        on_round(rounds, None)
    load = window.close()
    noisy = bool(noise(control_ms, [load] if load is not None else [], settings))
    return Interleaved(series, control_ms, noisy, rounds, clock() - started, unresolved_gap=bool(contested),
                       load=load)


__all__ = [
    "Clock", "Comparisons", "Dropped", "Interleaved", "K", "MeasureSettings", "Series", "Steppable", "Unwatched",
    "Watch", "Window", "control_shifted", "interleave", "noise", "overlaps", "per_step_s", "timed", "warm_up",
]
