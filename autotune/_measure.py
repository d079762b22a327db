"""Interleaved, adaptive timing of candidates that already passed set-up and verification.

Rounds run every active candidate in turn (A B C, A B C, ...) in the same process, so drift (a browser tab,
thermal throttling, a second job) hits all of them alike and the per-round ratios stay honest. After each
round the paired ratio intervals decide: a candidate clearly slower than the leader is dropped; measuring
stops when one candidate is left, when the rest are confidently within the margin of the leader, or when the
budget is spent. A control workload that no candidate can influence is timed every round; if it drifts the
machine was noisy, sampling is extended, and a result that stays noisy is flagged.

The clock and the steps are injected (STYLE.md "Measurement"), so tests run this exact algorithm on a fake
clock with synthetic step times.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from autotune import _stats

K = TypeVar("K", bound=Hashable)


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds from an arbitrary origin (``time.perf_counter``)."""


class Steppable(Protocol):
    def run(self) -> None:
        """One synchronised training step."""


@dataclass(frozen=True)
class MeasureSettings:
    """Knobs of the adaptive loop; defaults suit a 2-core laptop as well as a workstation GPU."""

    budget_s: float = 8.0
    min_rounds: int = 3
    max_rounds: int = 25
    #: a pick must be faster by more than this, with 95% confidence, to beat a simpler candidate
    margin: float = 0.03
    #: each candidate's share of a round lasts at least this long, so timer noise stays negligible
    round_min_s: float = 0.003
    #: the control may drift this much (see ``_stats.drift``) before the run counts as noisy
    noise_limit: float = 0.10
    #: a candidate this many times slower than the leader is dropped after a single round
    far_behind: float = 4.0
    #: pause before each control measurement
    settle_s: float = 0.001
    warmup_max_steps: int = 8
    warmup_stable: float = 0.15


@dataclass
class Series:
    """Per-round samples of one candidate, and why it stopped being measured."""

    steps_per_round: int
    round_ms: list[float] = field(default_factory=list)
    dropped: str | None = None


@dataclass
class Interleaved(Generic[K]):
    series: dict[K, Series]
    control_ms: list[float]
    noisy: bool
    rounds: int
    elapsed_s: float


def timed(step: Steppable, clock: Clock) -> float:
    started = clock()
    step.run()
    return clock() - started


def warm_up(step: Steppable, clock: Clock, recent_s: list[float], settings: MeasureSettings) -> list[float]:
    """Run extra steps until the last three agree within ``warmup_stable`` (allocator, JIT, kernel choice)."""
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
    labels: Callable[[K], str] = str,
    on_round: Callable[[int, K | None], None] | None = None,
    settle: Callable[[float], None] = time.sleep,
) -> Interleaved[K]:
    """Time ``steps`` in interleaved rounds until the decision is clear or the budget is spent."""
    series = {
        key: Series(steps_per_round=max(1, math.ceil(settings.round_min_s / max(estimate_s[key], 1e-9))))
        for key in steps
    }
    active = list(steps)
    for _ in range(3):
        control.run()  # the interpreter specialises a loop's bytecode on its first runs: not drift
    control_ms: list[float] = []
    started = clock()
    rounds = 0
    while active:
        for key in active:
            if on_round is not None:
                on_round(rounds, key)
            samples = [timed(steps[key], clock) for _ in range(series[key].steps_per_round)]
            series[key].round_ms.append(1000 * _stats.median(samples))
        # The least disturbed of a few runs (interference only adds time), after a pause that lets the
        # candidates' OpenMP threads stop spinning: on hyper-threaded cores they would slow the control down.
        settle(settings.settle_s)
        control_ms.append(1000 * min(timed(control, clock) for _ in range(3)))
        rounds += 1
        _drop_far_behind(series, active, settings, labels)
        drifting = _stats.drift(control_ms) > settings.noise_limit
        needed = settings.min_rounds * (2 if drifting else 1)
        if rounds >= needed and _settled(series, active, settings, labels):
            break
        # The budget never cuts below the minimum rounds: fewer samples give no interval at all.
        if rounds >= settings.min_rounds and clock() - started >= settings.budget_s or rounds >= settings.max_rounds:
            break
    if on_round is not None:
        on_round(rounds, None)
    noisy = _stats.drift(control_ms) > settings.noise_limit
    return Interleaved(series, control_ms, noisy, rounds, clock() - started)


def _rounds(series: Series) -> str:
    n = len(series.round_ms)
    return f"{n} round" if n == 1 else f"{n} rounds"


def _drop_far_behind(series: dict[K, Series], active: list[K], settings: MeasureSettings,
                     labels: Callable[[K], str]) -> None:
    """Drop, from the first round on, candidates so far behind that no interval is needed to see it."""
    leader = min(active, key=lambda k: _stats.median(series[k].round_ms))
    best = _stats.median(series[leader].round_ms)
    for key in [k for k in active if k != leader]:
        ratio = _stats.median(series[key].round_ms) / best
        if ratio > settings.far_behind:
            series[key].dropped = f"{ratio:.1f}x slower than {labels(leader)} after {_rounds(series[key])}"
            active.remove(key)


def _settled(series: dict[K, Series], active: list[K], settings: MeasureSettings, labels: Callable[[K], str]) -> bool:
    """Drop candidates clearly slower than the leader; True when nothing is left to resolve."""
    leader = min(active, key=lambda k: _stats.median(series[k].round_ms))
    unresolved = False
    for key in [k for k in active if k != leader]:
        estimate, low, high = _stats.ratio_interval(series[key].round_ms, series[leader].round_ms)
        if low > 1 + settings.margin:
            series[key].dropped = (
                f"clearly slower than {labels(leader)} ({estimate:.2f}x, interval {low:.2f}-{high:.2f}) "
                f"after {_rounds(series[key])}"
            )
            active.remove(key)
        elif high >= 1 + settings.margin:
            unresolved = True
    return len(active) == 1 or not unresolved


__all__ = ["Clock", "Interleaved", "MeasureSettings", "Series", "Steppable", "interleave", "timed", "warm_up"]
