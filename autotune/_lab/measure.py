"""Interleaved, sequential timing of candidates that already passed set-up and verification.

Each round runs every active candidate once, in a fresh seeded random order, so drift and position effects hit all
alike; at each of ``_stats.LOOKS`` the paired intervals drop, outpace and settle candidates (``looks``). Timing
stops when nothing is open or at the first look past the budget, but the final comparison times the open pairs that
can still change its pick on while they are worth their rounds (an estimate beyond what the pick may give away, or
rounds still needed cheap enough to fit the cap), up to ``overrun`` x the budget or the last look: a pair still open
then is named in the evidence, and one still worth its rounds flags the result. A busy machine (:func:`noise`: what
the operating system says other processes took, or a control workload whose level moved well past its own noise)
doubles the budget and flags the result. On an asynchronous device every candidate is timed as a loop runs it, each
step on the device's own clock inside a span after an untimed first step (``per_step_s``), so no pair mixes two
estimators. The clock, the steps and the operating system's view are injected (``Clock``, ``Steppable``,
``Watch``).
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

from autotune import _stats
from autotune._lab.looks import Comparisons, Dropped, K, Series, Standing, Verdict, drop_far_behind, look
from autotune._records import MachineLoad, NoiseCause
from autotune._rules import known


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds from an arbitrary origin (``time.perf_counter``)."""


class Runnable(Protocol):
    def run(self, steps: int = 1) -> None:
        """``steps`` steps back to back, synchronised once after the last."""

    def selected(self) -> contextlib.AbstractContextManager[None]:
        """Process-wide settings of this candidate (its thread count), applied outside the timed steps."""


class Steppable(Runnable, Protocol):
    #: steps are queued to a device and run while the host launches the next ones (CUDA, XPU, MPS): a training
    #: loop synchronises rarely, so launch time and device time overlap
    asynchronous: bool

    def span(self, steps: int) -> list[float]:
        """On an asynchronous device, the seconds of each of ``steps`` training steps as a loop runs them (its
        launches overlapping the step before), after an untimed step that takes the queue's fill and a cold
        start; synchronised once after the last."""


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
    #: ... as it does once other processes took this share of what the worker may use during a timing window (its
    #: CPUs, or its CPU quota: ``load.others``; half a core of 2), or the hypervisor this share of the machine's
    busy_other_share: float = 0.25
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
    #: on an asynchronous device a sample times at least this many steps of a span (``per_step_s``), and more
    #: where steps are short (``round_min_s``)
    span_steps: int = 1
    warmup_max_steps: int = 8
    warmup_stable: float = 0.15
    #: a candidate timed again, after others ran (their caches, a GPU's clocks gone down), warms up afresh: its
    #: steady step time is known, so a fresh step must come this close to it
    warmup_stable_again: float = 0.05
    #: a candidate's rounds in the final comparison this much slower while its device reported a throttle
    #: reason than its other rounds (``clocks``) make the result noisy: the CPU control cannot see that
    throttle_slowdown: float = 0.05

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
    #: what the budget counts: the seconds timing took, less the asynchronous spans' untimed first steps
    elapsed_s: float
    #: the final comparison's pick's pairs still open when timing stopped (the pick, the other): the pick may be
    #: further from the best than the pair allows (a close call, or rounds wrecked by a busy machine)
    open_pairs: list[tuple[K, K]] = field(default_factory=list)
    #: one of them was still worth its rounds at the cap: the next calibration measures again
    unresolved_gap: bool = False
    #: what the operating system saw during the rounds (None: it says nothing)
    load: MachineLoad | None = None
    #: the final comparison's pick at its last look (None in a pruning stage)
    pick: K | None = None


def noise(control_ms: list[float], loads: list[MachineLoad], settings: MeasureSettings) -> list[NoiseCause]:
    """Why timings taken beside this control and these windows are not the machine's own: other processes took
    ``busy_other_share`` or more of what the worker may use in a window, the hypervisor ``busy_steal`` of it, or
    the control's level moved past ``shift_floor`` and ``shift_noises`` times its own noise. Empty on a quiet
    machine."""
    causes: list[NoiseCause] = []
    if any(load.other_share is not None and load.other_share >= settings.busy_other_share for load in loads):
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


def timed(step: Runnable, clock: Clock, steps: int = 1) -> float:
    started = clock()
    step.run(steps)
    return clock() - started


def per_step_s(step: Steppable, clock: Clock, steps: int, *, spans: bool) -> list[float]:
    """Seconds per step, as a training loop sees them: each of ``steps`` steps on its own; or, ``spans``, each
    of ``steps`` steps inside a span (``Steppable.span``). A step synchronised alone adds the host's lead and
    the queue's fill and drain, and the first step after another candidate's (or after the device idled) runs
    on cold clocks and caches: none of them is a loop's, and none is in a figure, but for a step launched
    while a cold first one overran (a launch-bound step only: it runs short by the overrun), which the
    median of a span's several figures leaves out. Per step, not per span, so a heavy tail hits one figure,
    not a sample."""
    if not spans:
        return [timed(step, clock) for _ in range(steps)]
    return step.span(steps)


def steps_per_sample(step: Steppable, estimate_s: float, settings: MeasureSettings) -> int:
    """How many steps one sample of ``step`` times: at least ``round_min_s`` of them, so timer noise stays
    negligible, and on an asynchronous device at least ``span_steps`` (``per_step_s``)."""
    least = settings.span_steps if step.asynchronous else 1
    return max(least, math.ceil(settings.round_min_s / max(estimate_s, 1e-9)))


def warm_up(step: Steppable, clock: Clock, recent_s: list[float], settings: MeasureSettings, *,
            steady_s: float | None = None) -> list[float]:
    """Run extra steps until the last three agree within ``warmup_stable`` (allocator, JIT, kernel choice).

    A candidate timed before (``steady_s``: its step time then) warms up afresh, after other candidates ran
    (their caches, their allocations, a GPU's clocks gone down while idle): fresh samples until one is within
    ``warmup_stable_again`` of that steady time, each taken as its rounds take them (on an asynchronous device a
    span's per-step time, not a lone step's). Only a slower sample is a warm-up, and a disturbed one is
    followed by another, where three steps that must agree would keep a busy machine stepping; no new sample
    once ``warmup_max_steps`` steps have run."""
    with step.selected():
        if steady_s is not None:
            count = steps_per_sample(step, steady_s, settings) if step.asynchronous else 1
            cost = count + 1 if step.asynchronous else 1  # a span's untimed first step

            def sample() -> float:
                return _stats.median(per_step_s(step, clock, count, spans=step.asynchronous))

            times = [sample()]
            while (times[-1] > (1 + settings.warmup_stable_again) * steady_s
                   and len(times) * cost < settings.warmup_max_steps):
                times.append(sample())
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
    control: Runnable,
    clock: Clock,
    settings: MeasureSettings,
    comparisons: Comparisons[K],
    on_round: Callable[[int, K | None], None] | None = None,
    settle: Callable[[float], None] = time.sleep,
    answered: Callable[[Mapping[K, Series[K]]], bool] | None = None,
    sampled: Callable[[K], None] | None = None,
    watch: Watch | None = None,
) -> Interleaved[K]:
    """Time ``steps`` in interleaved rounds until every pair is resolved or the budget is spent (or, at a look,
    the caller's own question is ``answered``). Steps on an asynchronous device are timed in spans.
    ``sampled(key)`` runs right after each sample, while the device is still in the state its steps left;
    ``watch``: the operating system's view of the rounds; ``settle`` pauses before each control measurement."""
    series: dict[K, Series[K]] = {
        key: Series(steps_per_round=steps_per_sample(step, estimate_s[key], settings)) for key, step in steps.items()
    }
    active = list(steps)
    order = random.Random(settings.order_seed)
    for _ in range(3):
        control.run()  # the interpreter specialises a loop's bytecode on its first runs: not drift
    control_ms: list[float] = []
    window = (watch or Unwatched()).open()
    started = control_end = clock()
    #: what the asynchronous spans' untimed first steps and drains took: the price of timing steps as a loop
    #: runs them, like a warm-up; the budget is for the steps timed, or heavy steps would get half the rounds
    untimed_s = 0.0
    control_s = 0.0
    rounds = 0
    standing: Standing[K] = Standing()
    capped: set[frozenset[K]] = set()
    paused = False
    while active:
        for key in order.sample(active, len(active)):
            if on_round is not None:
                on_round(rounds, key)
            spans = steps[key].asynchronous
            with steps[key].selected():
                if paused and series[key].steps_per_round > 1 and not spans:
                    steps[key].run()  # cheap steps: one untimed step wakes the threads the control's pause put asleep
                share_started = clock()
                samples = per_step_s(steps[key], clock, series[key].steps_per_round, spans=spans)
                if spans:
                    untimed_s += clock() - share_started - sum(samples)
            paused = False
            series[key].round_ms.append(1000 * statistics.fmean(samples))  # the round's time over its steps
            if sampled is not None:
                sampled(key)
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
        standing = look(series, active, comparisons, rounds)
        if rounds >= settings.max_rounds:
            capped = {frozenset(v.pair) for v in standing.open}
            break
        if answered is not None and answered(series):
            break
        if drifting and rounds < 2 * _stats.LOOKS[0]:
            # A drifting machine gives every pair at least twice the first look's rounds before it settles.
            active[:] = [k for k in timing if series[k].dropped is None and series[k].outpaced is None]
        if not active:
            break
        elapsed_s = clock() - started - untimed_s
        if elapsed_s >= budget_s:
            # Past the budget, the final comparison times only the open pairs of the groups that can still change
            # the pick, while one of them is worth its rounds, until the cap (never below ``decisive_rounds`` for
            # heavy steps). A pair the pick rests on still worth them there flags the result (the next calibration
            # measures again); one not worth them stays open, named in the evidence, as measuring again would
            # leave it.
            worth = _worth(series, standing, rounds, elapsed_s, settings)
            if elapsed_s >= settings.overrun * settings.budget_s and rounds >= settings.decisive_rounds:
                capped = set(worth)
                break
            if not worth:
                break
            active[:] = [k for k in active if any(k in v.pair for v in standing.racing)]
    if on_round is not None:
        on_round(rounds, None)
    load = window.close()
    noisy = bool(noise(control_ms, [load] if load is not None else [], settings))
    return Interleaved(series, control_ms, noisy, rounds, clock() - started - untimed_s,
                       open_pairs=[v.pair for v in standing.open],
                       unresolved_gap=any(frozenset(v.pair) in capped for v in standing.open), load=load,
                       pick=standing.pick)


def ratio_known(steps: Mapping[K, Steppable], *, estimate_s: Mapping[K, float], clock: Clock,
                settings: MeasureSettings, error: float, cap_s: float) -> dict[K, Series[K]] | None:
    """Time two candidates in interleaved rounds until the ratio of the first's mean step time to the second's
    is known within ``error`` at a look (``_rules.known``: its interval at one look's error), e.g. a headline's; None
    once the rounds it would still take (the interval narrows as one over the root of the rounds) would run past
    ``cap_s`` seconds, or at the last look."""
    first, second = steps
    series: dict[K, Series[K]] = {
        key: Series(steps_per_round=steps_per_sample(step, estimate_s[key], settings)) for key, step in steps.items()
    }
    order = random.Random(settings.order_seed)
    started = clock()
    for rounds in range(1, settings.max_rounds + 1):
        for key in order.sample([first, second], 2):
            with steps[key].selected():
                samples = per_step_s(steps[key], clock, series[key].steps_per_round, spans=steps[key].asynchronous)
            series[key].round_ms.append(1000 * statistics.fmean(samples))
        if rounds not in _stats.LOOKS:
            continue
        ratio = _stats.ratio_interval(series[first].round_ms, series[second].round_ms)
        if known(ratio, error):
            return series
        # One round's spread in log units, from the interval's half width and its t quantile, at the normal one.
        alpha = _stats.ALPHA_PER_LOOK
        spread = math.log(ratio[2] / ratio[1]) / 2 / _stats.t_quantile(1 - alpha, rounds - 1) * math.sqrt(rounds)
        needed = (spread * _stats.t_quantile(1 - alpha, 10_000) / math.log1p(error)) ** 2
        if (clock() - started) * max(needed, rounds + 1) / rounds > cap_s:
            return None
    return None


def _worth(series: Mapping[K, Series[K]], standing: Standing[K], rounds: int, elapsed_s: float,
           settings: MeasureSettings) -> list[frozenset[K]]:
    """The open pairs that may change the pick worth timing past the budget: each whose estimate is beyond what
    the pick may give away and, whatever their estimates, those whose rounds are cheap (``decisive_rounds`` of
    them within the budget) and whose rounds still needed (about: at least ``decisive_rounds``, else
    :meth:`~autotune._lab.looks.Verdict.rounds_needed`) fit the cap together, in rounds and in time, the nearest
    first. Cheap rounds resolve a close call that dear ones cannot; a pair that would need more is left open at
    once rather than timed to the cap in vain."""
    def round_s(keys: set[K]) -> float:
        return sum(series[k].steps_per_round * _stats.median(series[k].round_ms[-_stats.LOOKS[0]:])
                   for k in keys) / (1000 * (1 - settings.control_share))

    def rounds_needed(one: Verdict[K]) -> float:  # fewer rounds than ``decisive_rounds`` cannot tell how many
        return float(settings.decisive_rounds) if one.rounds < settings.decisive_rounds else one.rounds_needed()

    found = [v for v in standing.racing if v.beyond]
    keys = {k for v in found for k in v.pair}
    needed = float(rounds)  # (those raced anyway are not bound by the cap's arithmetic)
    cheap = [v for v in standing.racing if not v.beyond and settings.decisive_rounds * round_s(set(v.pair)) <= (
        settings.budget_s)]
    for one in sorted(cheap, key=rounds_needed):
        more = max(needed, rounds_needed(one))
        if more <= settings.max_rounds and elapsed_s + (more - rounds) * round_s(keys | set(one.pair)) <= (
                settings.overrun * settings.budget_s):
            found.append(one)
            keys |= set(one.pair)
            needed = more
    return [frozenset(v.pair) for v in found]


__all__ = [
    "Clock", "Comparisons", "Dropped", "Interleaved", "K", "MeasureSettings", "Runnable", "Series", "Steppable",
    "Unwatched", "Watch", "Window", "control_shifted", "interleave", "noise", "per_step_s", "ratio_known",
    "steps_per_sample",
    "timed", "warm_up",
]
