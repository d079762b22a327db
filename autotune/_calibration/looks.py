"""What one look of the sequential test decides, pair by pair, from the paired ratio intervals (``_stats``).

- a candidate clearly slower than its group's leader (by more than the pair's margin) is *dropped* and keeps
  that evidence: it counts as clearly slower in every later decision;
- a pair is *resolved* once more rounds cannot change the pick by more than the margin: where a tie goes to
  the slower side (fp32 against bf16, torch's thread count against another), when the faster side is within
  the margin of it; otherwise (speed decides, or the faster side is the preferred one) as soon as the slower
  cannot be faster by more than the margin. Late (past ``settle_ties_at`` rounds and half the budget), only a
  pair whose faster side leads by more than the margin on the estimate, where a tie goes to the slower, is
  timed further;
- a group whose fastest candidate is clearly slower than another group's (in the final comparison, or far
  behind after one round in any stage) is *outpaced*: it loses the device choice, is no longer timed, and
  stays its own device's answer for a user who prefers that device;
- a candidate whose every pair is resolved is *settled* and no longer timed.

Leaders are ranked on the rounds every contender shares: a settled candidate's median over its early rounds is
never compared with another's over later, drifted ones. The one-round far-behind rules (4x) are heuristics
outside the 5% error budget of ``_stats``. The loop that times the rounds is ``measure.interleave``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from autotune import _stats
from autotune._rules import INDIFFERENCE, MARGIN

K = TypeVar("K", bound=Hashable)


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


@dataclass(frozen=True)
class Comparisons(Generic[K]):
    """Which pairs a stage must resolve: each candidate against its group's leader, and, in the final
    comparison, the groups' leaders against one another. ``margin(a, b)`` is the pair's margin;
    ``tie_winner(a, b)`` the one a tie goes to (None: the faster estimate). ``wide_gap``: in the final
    comparison, an unresolved gap of the fastest candidate beyond this (slower / faster - 1), which a tie would
    give to the slower side, is worth overrunning the budget for, and flags the result when left unresolved; one
    value for every pair (twice a precision's margin: a thread count's 3% left to its tie is no such gap)."""

    group: Callable[[K], Hashable]
    margin: Callable[[K, K], float]
    tie_winner: Callable[[K, K], K | None] = lambda a, b: None
    across_groups: bool = False
    wide_gap: float = 2 * MARGIN


def ranked(series: Mapping[K, Series[K]], keys: list[K]) -> list[K]:
    """``keys`` fastest first, by their medians over the rounds they all share: a settled candidate's median
    over its first rounds is not compared with another's over later, drifted ones."""
    shared = min(len(series[k].round_ms) for k in keys)
    return sorted(keys, key=lambda k: _stats.median(series[k].round_ms[:shared]))


def _leaders(series: Mapping[K, Series[K]], keys: list[K], comparisons: Comparisons[K]) -> dict[Hashable, K]:
    leaders: dict[Hashable, K] = {}
    for key in ranked(series, keys):
        leaders.setdefault(comparisons.group(key), key)
    return leaders


def drop_far_behind(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K],
                    estimate_s: Mapping[K, float], *, far_behind: float, far_behind_device: float) -> None:
    """After the first round: drop candidates so far behind their group's leader that no interval is needed,
    and stop timing candidates that far behind the fastest one of another group (outpaced).

    A candidate's time is the better of its first round and its warm-up estimate, so one disturbed round
    (a hiccup of the machine) cannot push it out.
    """
    def ratio_to(key: K, leader: K) -> float:
        return min(series[key].round_ms[0], 1000 * estimate_s[key]) / series[leader].round_ms[0]

    leaders = _leaders(series, active, comparisons)
    overall = ranked(series, active)[0]
    for key in list(active):
        leader = leaders[comparisons.group(key)]
        ratio = ratio_to(key, leader)
        if key != leader and ratio > far_behind:
            series[key].dropped = Dropped(leader, ratio, ratio, ratio, 1, far_behind=True)
            active.remove(key)
    for group, leader in _leaders(series, active, comparisons).items():
        ratio = ratio_to(leader, overall)
        if group != comparisons.group(overall) and ratio > far_behind_device:
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
    overall = ranked(series, keys)[0]
    for key in keys:
        leader = leaders[comparisons.group(key)]
        if key != leader:
            yield key, leader
        elif comparisons.across_groups and key != overall:
            yield key, overall


def look(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K], rounds: int, *,
         late: bool) -> set[K]:
    """One look: drop the clearly slower, mark the outpaced, settle the resolved (``active`` keeps the rest).

    Returns, in the final comparison, the candidates of the fastest candidate's unresolved pairs when one of
    them is a gap well beyond its margin that a tie would give to the slower side (else nothing): they are
    worth timing past the budget.
    """
    contenders = [k for k, s in series.items() if s.dropped is None and s.outpaced is None]
    overall = ranked(series, contenders)[0]
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
        elif key in active and leader in active and is_open(
                tie_to_slower := comparisons.tie_winner(key, leader) == key, (estimate, low, high),
                max(pair_margin, INDIFFERENCE), late=late):
            unresolved.update((key, leader))
            if overall in (key, leader) and comparisons.across_groups:
                with_leader.update((key, leader))
                # A gap, not a near-tie, that a tie would give to the slower side: more rounds may change the pick.
                wide = tie_to_slower and estimate > 1 + comparisons.wide_gap
                decisive = decisive or wide
    # Settled: every pair resolved (or one side no longer timed); it keeps its rounds and leaves the rounds.
    active[:] = [k for k in active if k in unresolved and series[k].dropped is None and series[k].outpaced is None]
    return with_leader if decisive else set()


def is_open(tie_to_slower: bool, ratio: tuple[float, float, float], margin: float, *, late: bool) -> bool:
    """Can more rounds still change which of a pair is picked by more than ``margin`` (see the module's
    "resolved")? ``ratio``: the (estimate, low, high) of slower / faster; ``late``: past ``settle_ties_at``
    rounds and ``settle_ties_share`` of the budget."""
    estimate, low, high = ratio
    if tie_to_slower:
        return high >= 1 + margin and (not late or estimate > 1 + margin)
    return not late and low * (1 + margin) <= 1


__all__ = ["Comparisons", "Dropped", "K", "Series", "drop_far_behind", "look", "ranked"]
