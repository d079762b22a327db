"""What one look of the sequential test decides, pair by pair, from the paired ratio intervals (``_stats``).

Successive elimination with an indifference zone (Even-Dar, Mannor & Mansour 2006; Kim & Nelson 2001 for paired
rounds): each candidate is tested against its group's leader (in the final comparison also each leader against
the fastest), at ``_stats.ALPHA_PER_LOOK`` split over the look's pairs. One clearly slower than its leader by
more than the pair's margin is *dropped*, a group clearly slower than another is *outpaced*, a pair is
*resolved* once its pick is surely within margin + indifference (``_rules.INDIFFERENCE``) of the other, and a
candidate whose pairs are all resolved is *settled*. The rounds are timed by ``measure.interleave``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from autotune import _stats
from autotune._rules import INDIFFERENCE

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
    comparison, the groups' leaders against one another. ``margin(a, b)`` is the pair's margin,
    ``indifference(a, b)`` how much past it a pick may be before more rounds are owed; ``tie_winner(a, b)`` the
    one a tie goes to (None: the faster estimate)."""

    group: Callable[[K], Hashable]
    margin: Callable[[K, K], float]
    tie_winner: Callable[[K, K], K | None] = lambda a, b: None
    across_groups: bool = False
    indifference: Callable[[K, K], float] = lambda a, b: INDIFFERENCE


def ranked(series: Mapping[K, Series[K]], keys: list[K]) -> list[K]:
    """``keys`` fastest first, by their paired ratios to the longest-timed of them (:func:`_stats.paired_scores`)."""
    scores = _stats.paired_scores({k: series[k].round_ms for k in keys})
    return sorted(keys, key=scores.__getitem__)


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


def look(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K], rounds: int) -> set[K]:
    """One look: drop the clearly slower, mark the outpaced, settle the resolved (``active`` keeps the rest).

    Returns, in the final comparison, the candidates of the fastest candidate's open pairs whose estimated gap
    is beyond what the pick may give away (the larger of margin and indifference): the pick still rests on them,
    so they are worth timing past the budget, up to its cap; a near-tie left open there goes to the tie rule.
    """
    # A settled candidate's pairs were resolved: the open ones are decided against the leaders still timed (a
    # leader no longer timed would leave its rivals' pairs open with no rounds to close them).
    contenders = [k for k, s in series.items() if s.dropped is None and s.outpaced is None]
    contenders = [k for k in contenders if k in active] or contenders
    overall = ranked(series, contenders)[0]
    unresolved: set[K] = set()
    with_leader: set[K] = set()
    pairs = list(_pairs(series, contenders, comparisons))
    alpha = _stats.ALPHA_PER_LOOK / max(1, len(pairs))  # every pair the look decides: one error budget
    for key, leader in pairs:
        if series[key].dropped is not None or series[key].outpaced is not None:
            continue
        estimate, low, high = _stats.ratio_interval(series[key].round_ms, series[leader].round_ms, alpha=alpha)
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
                comparisons.tie_winner(key, leader) == key, (estimate, low, high), pair_margin,
                indifference := comparisons.indifference(key, leader)):
            unresolved.update((key, leader))
            # An estimated gap beyond the margin (or the indifference of the same math): the pick may be wrong by
            # more than it allows, so the pair is worth more rounds, and flags the result if still open at the cap.
            if overall in (key, leader) and comparisons.across_groups and estimate > 1 + max(pair_margin,
                                                                                              indifference):
                with_leader.update((key, leader))
    # Settled: every pair resolved (or one side no longer timed); it keeps its rounds and leaves the rounds.
    active[:] = [k for k in active if k in unresolved and series[k].dropped is None and series[k].outpaced is None]
    return with_leader


def is_open(tie_to_slower: bool, ratio: tuple[float, float, float], margin: float, indifference: float) -> bool:
    """Can more rounds still change the pick of a pair by more than the pair allows? ``ratio``: the (estimate,
    low, high) of slower / faster. A tie to the slower side is resolved once the faster is clearly beyond the
    margin (then dropped) or surely within margin + indifference of it; a pair that speed decides, once the
    slower cannot be faster than the faster by more than the larger of the two."""
    _, low, high = ratio
    if tie_to_slower:
        return high >= 1 + margin + indifference
    return low * (1 + max(margin, indifference)) <= 1


__all__ = ["Comparisons", "Dropped", "K", "Series", "drop_far_behind", "look", "ranked"]
