"""Interleaved, sequential timing of candidates that already passed set-up and verification.

Rounds run every active candidate in turn, in alternating order (A B C, C B A, ...), in the same process:
drift (a browser tab, thermal throttling, a second job) hits all of them alike, and a steady ramp cancels
out of the per-round ratios instead of favouring whoever runs first. At each look of the sequential test
(``_stats.LOOKS``) the paired ratio intervals decide, pair by pair:

- a candidate clearly slower than its group's leader (by more than the pair's margin) is *dropped* and keeps
  that evidence: it counts as clearly slower in every later decision;
- a pair is *resolved* once more rounds cannot change the pick by more than the margin: where a tie goes to
  the slower side (fp32 against bf16, torch's thread count against another), when the faster side is within
  the margin of it; otherwise (speed decides, or the faster side is the preferred one) as soon as the slower
  cannot be faster by more than the margin. Past ``settle_ties_at`` rounds and half the budget, only a pair
  whose faster side leads by more than the margin on the estimate, where a tie goes to the slower, is timed
  further;
- a group whose fastest candidate is clearly slower than another group's (in the final comparison, or far
  behind after one round in any stage) is *outpaced*: it loses the device choice, is no longer timed, and
  stays its own device's answer for a user who prefers that device;
- a candidate whose every pair is resolved is *settled* and no longer timed.

Timing stops when nothing is unresolved, or at the first look past the budget (the final comparison may
overrun it to resolve the leader's own comparisons) or at ``max_rounds``. A control workload that no
candidate can influence is timed after every round (past the first look, in at most ``control_share`` of the
time); when it drifts, the budget is doubled (and no pair settles before twice the first look's rounds), and a
result that stays noisy is flagged. Leaders are ranked on the rounds every contender shares: a settled
candidate's median over its early rounds is never compared with another's over later, drifted ones. The
one-round far-behind rules (4x) are heuristics outside the 5% error budget of ``_stats``.

The clock and the steps are injected (STYLE.md "Measurement"), so tests and ``benchmarks/decision_sim.py``
run this exact algorithm on a fake clock against known truths.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from autotune import _stats
from autotune._rules import INDIFFERENCE

K = TypeVar("K", bound=Hashable)


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
    #: from this many rounds on, once ``settle_ties_share`` of the budget is spent, only a pair whose pick more
    #: rounds may still change is timed; near-ties are settled there. Cheap rounds go on: one CPU thread 4% faster
    #: than two, on sub-millisecond steps whose per-round ratios vary by 10%, needs 150-250 rounds (2 s)
    settle_ties_at: int = 30
    settle_ties_share: float = 0.5
    #: each candidate's share of a round lasts at least this long, so timer noise stays negligible
    round_min_s: float = 0.003
    #: the control may drift this much (see ``_stats.drift``) before the run counts as noisy
    noise_limit: float = 0.10
    #: a candidate this many times slower than its group's leader is dropped after a single round
    far_behind: float = 4.0
    #: ... and one this many times slower than another group's fastest is outpaced (no longer timed)
    far_behind_device: float = 4.0
    #: how far past its budget the final comparison may go to resolve the pick's own comparisons
    overrun: float = 3.0
    #: ... and the fewest rounds it gives them before that cap applies (a step of seconds: a few rounds)
    decisive_rounds: int = 10
    #: pause before each control measurement
    settle_s: float = 0.001
    #: past the first look, the control takes at most this share of the time: every round of heavy steps, every
    #: third one of sub-millisecond steps, whose rounds it would otherwise almost double (1.4 ms a run here)
    control_share: float = 0.25
    warmup_max_steps: int = 8
    warmup_stable: float = 0.15

    @model_validator(mode="after")
    def _max_rounds_is_a_look(self) -> MeasureSettings:
        if self.max_rounds not in _stats.LOOKS:
            raise ValueError(f"max_rounds must be one of the looks {_stats.LOOKS}, not {self.max_rounds}")
        return self


@dataclass(frozen=True)
class Dropped(Generic[K]):
    """The evidence that a candidate is clearly slower than ``by``: the paired ratio and its rounds."""

    by: K
    estimate: float
    low: float
    high: float
    rounds: int
    far_behind: bool


@dataclass
class Series(Generic[K]):
    """Per-round samples of one candidate (round ``i`` of every series is the same round), and its fate."""

    steps_per_round: int
    round_ms: list[float] = field(default_factory=list)
    #: clearly slower than a candidate of its own group: never picked
    dropped: Dropped[K] | None = None
    #: clearly slower than a candidate of another group: loses the device choice, still its group's answer
    outpaced: Dropped[K] | None = None


@dataclass
class Interleaved(Generic[K]):
    series: dict[K, Series[K]]
    control_ms: list[float]
    noisy: bool
    rounds: int
    elapsed_s: float
    #: the final comparison stopped at its cap with a gap well beyond a margin of the fastest candidate's
    #: still unresolved: the tie rule then decides against the estimate (rounds wrecked by a busy machine)
    unresolved_gap: bool = False


@dataclass(frozen=True)
class Comparisons(Generic[K]):
    """Which pairs a stage must resolve: each candidate against its group's leader, and, in the final
    comparison, the groups' leaders against one another. ``margin(a, b)`` is the pair's margin;
    ``tie_winner(a, b)`` the one a tie goes to (None: the faster estimate)."""

    group: Callable[[K], Hashable]
    margin: Callable[[K, K], float]
    tie_winner: Callable[[K, K], K | None] = lambda a, b: None
    across_groups: bool = False


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
    for _ in range(3):
        control.run()  # the interpreter specialises a loop's bytecode on its first runs: not drift
    control_ms: list[float] = []
    started = control_end = clock()
    control_s = 0.0
    rounds = 0
    decisive: set[K] = set()
    while active:
        for key in active if rounds % 2 == 0 else reversed(active):
            if on_round is not None:
                on_round(rounds, key)
            with steps[key].selected():
                samples = [timed(steps[key], clock) for _ in range(series[key].steps_per_round)]
            series[key].round_ms.append(1000 * _stats.median(samples))
        if rounds < _stats.LOOKS[0] or clock() - control_end >= control_s / settings.control_share:
            # The least disturbed of a few runs (interference only adds time), after a pause that lets the
            # candidates' OpenMP threads stop spinning: on hyper-threaded cores they would slow the control down.
            control_start = clock()
            settle(settings.settle_s)
            control_ms.append(1000 * min(timed(control, clock) for _ in range(3)))
            control_end = clock()
            control_s = control_end - control_start
        rounds += 1
        if rounds == 1:
            _drop_far_behind(series, active, comparisons, settings, estimate_s)
        if rounds not in _stats.LOOKS and rounds < settings.max_rounds:
            continue
        timing = list(active)
        late = rounds >= settings.settle_ties_at and clock() - started >= settings.settle_ties_share * settings.budget_s
        decisive = _look(series, active, comparisons, rounds, late=late)
        drifting = _stats.drift(control_ms) > settings.noise_limit
        if rounds >= settings.max_rounds or (answered is not None and answered(series)):
            break
        if drifting and rounds < 2 * _stats.LOOKS[0]:
            # A drifting machine gives every pair at least twice the first look's rounds before it settles.
            active[:] = [k for k in timing if series[k].dropped is None and series[k].outpaced is None]
        if not active:
            break
        elapsed_s = clock() - started
        if elapsed_s >= settings.budget_s * (2 if drifting else 1):
            # Past the budget, the final comparison still resolves the fastest candidate's comparisons whose
            # estimate lies well beyond the margin (and times nothing else): a tie declared for want of rounds
            # would hand the pick to the simpler side however large the gap. Capped in time, but never below
            # ``decisive_rounds`` for heavy steps.
            capped = elapsed_s >= settings.overrun * settings.budget_s and rounds >= settings.decisive_rounds
            if not decisive or capped:
                break
            active[:] = [k for k in active if k in decisive]
    if on_round is not None:
        on_round(rounds, None)
    noisy = _stats.drift(control_ms) > settings.noise_limit
    return Interleaved(series, control_ms, noisy, rounds, clock() - started, unresolved_gap=bool(decisive))


def _ranked(series: Mapping[K, Series[K]], keys: list[K]) -> list[K]:
    """``keys`` fastest first, by their medians over the rounds they all share: a settled candidate's median
    over its first rounds is not compared with another's over later, drifted ones."""
    shared = min(len(series[k].round_ms) for k in keys)
    return sorted(keys, key=lambda k: _stats.median(series[k].round_ms[:shared]))


def _leaders(series: Mapping[K, Series[K]], keys: list[K], comparisons: Comparisons[K]) -> dict[Hashable, K]:
    leaders: dict[Hashable, K] = {}
    for key in _ranked(series, keys):
        leaders.setdefault(comparisons.group(key), key)
    return leaders


def _drop_far_behind(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K],
                     settings: MeasureSettings, estimate_s: Mapping[K, float]) -> None:
    """After the first round: drop candidates so far behind their group's leader that no interval is needed,
    and stop timing candidates that far behind the fastest one of another group (outpaced).

    A candidate's time is the better of its first round and its warm-up estimate, so one disturbed round
    (a hiccup of the machine) cannot push it out.
    """
    def ratio_to(key: K, leader: K) -> float:
        return min(series[key].round_ms[0], 1000 * estimate_s[key]) / series[leader].round_ms[0]

    leaders = _leaders(series, active, comparisons)
    overall = _ranked(series, active)[0]
    for key in list(active):
        leader = leaders[comparisons.group(key)]
        ratio = ratio_to(key, leader)
        if key != leader and ratio > settings.far_behind:
            series[key].dropped = Dropped(leader, ratio, ratio, ratio, 1, far_behind=True)
            active.remove(key)
    for group, leader in _leaders(series, active, comparisons).items():
        ratio = ratio_to(leader, overall)
        if group != comparisons.group(overall) and ratio > settings.far_behind_device:
            _outpace(series, active, comparisons, group, Dropped(overall, ratio, ratio, ratio, 1, far_behind=True))


def _outpace(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K], group: Hashable,
             evidence: Dropped[K]) -> None:
    """The whole group's best is clearly slower than another group's: none of it is timed any more."""
    for key, one in series.items():
        if comparisons.group(key) == group and one.dropped is None and one.outpaced is None:
            one.outpaced = evidence
            if key in active:
                active.remove(key)


def _pairs(series: Mapping[K, Series[K]], keys: list[K], comparisons: Comparisons[K]) -> Iterator[tuple[K, K]]:
    """(candidate, the leader it must be resolved against), for every pair the stage decides: each candidate
    against its group's leader, and in the final comparison each group's leader against the fastest overall."""
    leaders = _leaders(series, keys, comparisons)
    overall = _ranked(series, keys)[0]
    for key in keys:
        leader = leaders[comparisons.group(key)]
        if key != leader:
            yield key, leader
        elif comparisons.across_groups and key != overall:
            yield key, overall


def _look(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K], rounds: int, *,
          late: bool) -> set[K]:
    """One look: drop the clearly slower, mark the outpaced, settle the resolved (``active`` keeps the rest).

    Returns, in the final comparison, the candidates of the fastest candidate's unresolved pairs when one of
    them is a gap well beyond its margin that a tie would give to the slower side (else nothing): they are
    worth timing past the budget.
    """
    contenders = [k for k, s in series.items() if s.dropped is None and s.outpaced is None]
    overall = _ranked(series, contenders)[0]
    unresolved: set[K] = set()
    with_leader: set[K] = set()
    decisive = False
    for key, leader in list(_pairs(series, contenders, comparisons)):
        if series[key].dropped is not None or series[key].outpaced is not None:
            continue
        estimate, low, high = _stats.ratio_interval(series[key].round_ms, series[leader].round_ms)
        pair_margin = comparisons.margin(key, leader)
        if low > 1 + pair_margin:
            evidence = Dropped(leader, estimate, low, high, min(len(series[key].round_ms), rounds), far_behind=False)
            if comparisons.group(key) == comparisons.group(leader):
                series[key].dropped = evidence
                if key in active:
                    active.remove(key)
            else:
                _outpace(series, active, comparisons, comparisons.group(key), evidence)
        elif key in active and leader in active and _open(
                tie_to_slower := comparisons.tie_winner(key, leader) == key, (estimate, low, high),
                max(pair_margin, INDIFFERENCE), late=late):
            unresolved.update((key, leader))
            if overall in (key, leader) and comparisons.across_groups:
                with_leader.update((key, leader))
                # A gap, not a near-tie, that a tie would give to the slower side: more rounds may change the pick.
                wide = tie_to_slower and estimate > 1 + 2 * max(pair_margin, INDIFFERENCE)
                decisive = decisive or wide
    # Settled: every pair resolved (or one side no longer timed); it keeps its rounds and leaves the rounds.
    active[:] = [k for k in active if k in unresolved and series[k].dropped is None and series[k].outpaced is None]
    return with_leader if decisive else set()


def _open(tie_to_slower: bool, ratio: tuple[float, float, float], margin: float, *, late: bool) -> bool:
    """Can more rounds still change which of a pair is picked by more than ``margin`` (see the module's
    "resolved")? ``ratio``: the (estimate, low, high) of slower / faster; ``late``: past ``settle_ties_at``
    rounds and ``settle_ties_share`` of the budget."""
    estimate, low, high = ratio
    if tie_to_slower:
        return high >= 1 + margin and (not late or estimate > 1 + margin)
    return not late and low * (1 + margin) <= 1


__all__ = [
    "Clock", "Comparisons", "Dropped", "Interleaved", "MeasureSettings", "Series", "Steppable", "interleave",
    "timed", "warm_up",
]
