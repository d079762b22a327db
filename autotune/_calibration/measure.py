"""Interleaved, sequential timing of candidates that already passed set-up and verification.

Rounds run every active candidate in turn, in a fresh seeded random order each round, in the same process:
drift (a browser tab, thermal throttling, a second job) hits all of them alike, and neither a steady ramp nor
a position effect (the candidate after another one finds its caches evicted) favours anyone. At each look of
the sequential test (``_stats.LOOKS``) the paired ratio intervals drop, outpace and settle candidates
(``looks``).

Timing stops when nothing is unresolved, or at the first look past the budget, except that the final
comparison goes on timing the pick's open pairs up to ``overrun`` times the budget; a pick still open there is
flagged (measured again by the next calibration). A control workload that no candidate can influence is timed
after each of the first look's rounds, then whenever that keeps it within ``control_share`` of the time; when
it drifts, the budget is doubled (and no pair settles before twice the first look's rounds), and a result that
stays noisy is flagged.

The clock and the steps are injected, so tests and ``benchmarks/decision_sim.py`` run this exact algorithm on
a fake clock against known truths.
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
from autotune._calibration.looks import Comparisons, Dropped, K, Series, drop_far_behind, look


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds from an arbitrary origin (``time.perf_counter``)."""


class Steppable(Protocol):
    def run(self) -> None:
        """One synchronised training step."""

    def selected(self) -> contextlib.AbstractContextManager[None]:
        """Process-wide settings of this candidate (its thread count), applied outside the timed steps."""


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
    #: the control may drift this much (see ``_stats.drift``) before the run counts as noisy
    noise_limit: float = 0.10
    #: a candidate this many times slower than its group's leader is dropped after a single round
    far_behind: float = 4.0
    #: ... and one this many times slower than another group's fastest is outpaced (no longer timed)
    far_behind_device: float = 4.0
    #: how far past its budget the final comparison may go to resolve the pick's open pairs (the cap)
    overrun: float = 3.0
    #: ... and the fewest rounds it gives them before that cap applies (a step of seconds: a few rounds)
    decisive_rounds: int = 10
    #: pause before each control measurement
    settle_s: float = 0.001
    #: past the first look, the control takes at most this share of the time: every round of heavy steps, every
    #: few of sub-millisecond steps, whose rounds it would otherwise almost double
    control_share: float = 0.25
    warmup_max_steps: int = 8
    warmup_stable: float = 0.15

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


def timed(step: Steppable, clock: Clock) -> float:
    started = clock()
    step.run()
    return clock() - started


def warm_up(step: Steppable, clock: Clock, recent_s: list[float], settings: MeasureSettings) -> list[float]:
    """Run extra steps until the last three agree within ``warmup_stable`` (allocator, JIT, kernel choice)."""
    times = list(recent_s)
    with step.selected():
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
) -> Interleaved[K]:
    """Time ``steps`` in interleaved rounds until every pair is resolved or the budget is spent (or, at a look,
    the caller's own question is ``answered``)."""
    series: dict[K, Series[K]] = {
        key: Series(steps_per_round=max(1, math.ceil(settings.round_min_s / max(estimate_s[key], 1e-9))))
        for key in steps
    }
    active = list(steps)
    order = random.Random(settings.order_seed)
    for _ in range(3):
        control.run()  # the interpreter specialises a loop's bytecode on its first runs: not drift
    control_ms: list[float] = []
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
                if paused and series[key].steps_per_round > 1:
                    steps[key].run()  # cheap steps: one untimed step wakes the threads the control's pause put asleep
                samples = [timed(steps[key], clock) for _ in range(series[key].steps_per_round)]
            paused = False
            series[key].round_ms.append(1000 * _stats.median(samples))
        share = settings.control_share
        if rounds < _stats.LOOKS[0] or clock() - control_end >= control_s * (1 - share) / share:
            # The least disturbed of a few runs (interference only adds time), after a pause that lets the
            # candidates' OpenMP threads stop spinning: on hyper-threaded cores they would slow the control down.
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
        drifting = _stats.drift(control_ms) > settings.noise_limit
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
    noisy = _stats.drift(control_ms) > settings.noise_limit
    return Interleaved(series, control_ms, noisy, rounds, clock() - started, unresolved_gap=bool(contested))


__all__ = [
    "Clock", "Comparisons", "Dropped", "Interleaved", "K", "MeasureSettings", "Series", "Steppable", "interleave",
    "timed", "warm_up",
]
