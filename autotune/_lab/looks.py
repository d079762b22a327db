"""What one look of the sequential test decides, pair by pair, from the paired ratio intervals (``_stats``).

Successive elimination with an indifference zone (Even-Dar, Mannor & Mansour 2006; Kim & Nelson 2001 for paired
rounds): every look forms the pick the decision would make on the rounds so far and tests each candidate against its
group's pick and, while that pick's pair with it is open, against its group's fastest, by the means and on a typical
round (in the final comparison each group's pick against the overall pick too): at most k - 1 pairs per candidate,
each at a look's share of ``_stats.ALPHA`` over k - 1. One clearly slower by more than the pair's margin is
*dropped*, a group clearly slower than another is *outpaced*, a pair is *resolved* once the one the decision prefers
is surely within what the pair allows of the other (``_rules.is_open``), and a candidate whose pairs are all
resolved is *settled*. Pairs are ordered on the rounds they share, as the ratio of their mean step times, less the
rounds a disturbance of the machine slowed (``_stats.machine_tails``, judged once per look over every candidate of
the comparison). The rounds are timed by ``measure.interleave``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from autotune import _stats
from autotune._rules import INDIFFERENCE, is_open

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


def ranked(series: Mapping[K, Series[K]], keys: list[K], tails: _stats.Tails[K] | None = None) -> list[K]:
    """``keys`` fastest first, by their paired ratios to the longest-timed of them (:func:`_stats.paired_scores`;
    ``tails``: the look's, default judged over ``keys``)."""
    scores = _stats.paired_scores({k: series[k].round_ms for k in keys}, tails)
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

    Each candidate's time, its leader's too, is the better of its first round and its warm-up estimate: one
    disturbed round (a hiccup of the machine) can neither push a candidate out nor keep one in, as a leader's
    round 4x slow would keep a device 10x behind it timed through every dear round of the stage.
    """
    def best_ms(key: K) -> float:
        return min(series[key].round_ms[0], 1000 * estimate_s[key])

    def ratio_to(key: K, leader: K) -> float:
        return best_ms(key) / best_ms(leader)

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


def _order(series: Mapping[K, Series[K]], keys: list[K], comparisons: Comparisons[K],
           tails: _stats.Tails[K]) -> list[K]:
    """``keys`` as a decision prefers them: the one a tie goes to first, else the faster on the rounds the two
    share (their paired estimate: one no longer timed keeps its place against another still timed)."""
    def before(a: K, b: K) -> int:
        winner = comparisons.tie_winner(a, b)
        if winner is not None:
            return -1 if winner == a else 1
        estimate = _stats.ratio_interval(series[a].round_ms, series[b].round_ms,
                                         left_out=_left_out(series, a, b, tails))[0]
        return (estimate > 1) - (estimate < 1)

    return sorted(keys, key=functools.cmp_to_key(before))


def _pairs(series: Mapping[K, Series[K]], keys: list[K], comparisons: Comparisons[K],
           tails: _stats.Tails[K]) -> tuple[K, dict[tuple[K, K], frozenset[K] | None]]:
    """The pick among ``keys`` (the decision's rule on the estimates so far), and every pair the stage decides,
    each as (the one the decision prefers, the other) with the pair it matters through (None: by itself).

    Each candidate is paired with its group's pick and, in the final comparison, each group's pick with the
    overall pick. Where the pick is not the fastest, each is paired with the fastest too, which matters only while
    the pick's own pair with the fastest is open: the fastest may yet beat the pick, and one no longer timed must
    not become the pick unresolved then. Another candidate matters against the pick only while its pair with the
    fastest is open: resolved, the pick's pair with the fastest answers for it. So is the fastest on a typical
    round (:func:`_typically_fastest`), where it is another: one slow round moves the means' order in the first
    looks, and a candidate resolved only against a pick that the true leader drops later would have left the
    rounds with its pair against that leader open. Any two candidates share one pair at most."""
    groups: dict[Hashable, list[K]] = {}
    for key in keys:
        groups.setdefault(comparisons.group(key), []).append(key)
    pairs: dict[tuple[K, K], frozenset[K] | None] = {}

    def against(members: list[K]) -> K:
        order = _order(series, members, comparisons, tails)
        place = {key: index for index, key in enumerate(order)}
        pick, fastest = order[0], ranked(series, members, tails)[0]
        rivals = list(dict.fromkeys((fastest, _typically_fastest(series, pick, members))))
        for key in members:
            if key == pick:
                continue
            pairs[(pick, key)] = frozenset((key, fastest)) if key != fastest else None
            for rival in rivals:
                if rival not in (pick, key):
                    pairs.setdefault((key, rival) if place[key] < place[rival] else (rival, key),
                                     frozenset((pick, rival)))
        return pick

    picks = [against(members) for members in groups.values()]
    if comparisons.across_groups:
        return against(picks), pairs
    return _order(series, picks, comparisons, tails)[0], pairs


def _typically_fastest(series: Mapping[K, Series[K]], pick: K, keys: list[K]) -> K:
    """The one of ``keys`` fastest on a typical round: the lowest median of its rounds' ratios to ``pick``'s same
    rounds (``pick`` itself at 1), which no single slow round moves, as it moves a ratio of means."""
    def typical(key: K) -> float:
        mine, theirs = series[key].round_ms, series[pick].round_ms
        return 1.0 if key == pick else _stats.median([a / b for a, b in zip(mine, theirs, strict=False)])

    return min(keys, key=typical)


def _left_out(series: Mapping[K, Series[K]], a: K, b: K, tails: _stats.Tails[K]) -> frozenset[int]:
    return _stats.left_out(tails, a, b, min(len(series[a].round_ms), len(series[b].round_ms)))


@dataclass(frozen=True)
class Verdict(Generic[K]):
    """One pair at one look: ``pair`` (the one the decision prefers, the other), ``ratio`` the first's step time
    over the other's (estimate, low, high) on the ``rounds`` both have, at one-sided error ``alpha``; the one
    ``clearly`` slower than the other by more than the pair's margin, if either; whether the pair is still
    ``open`` (:func:`~autotune._rules.is_open`)."""

    pair: tuple[K, K]
    ratio: tuple[float, float, float]
    rounds: int
    alpha: float
    clearly: K | None
    open: bool
    margin: float
    indifference: float
    tie_to_first: bool

    @property
    def beyond(self) -> bool:
        """The preferred one's estimate is slower by more than the larger of margin and indifference."""
        return self.ratio[0] > 1 + max(self.margin, self.indifference)

    def rounds_needed(self) -> float:
        """About the rounds at which the open pair would resolve, were its estimate and spread right: the interval
        narrows as one over the root of the rounds (and its t quantile towards the normal one) until a bound
        crosses the nearest line that decides the pair (either one clearly slower, or the preferred one surely
        within what the pair allows). Infinite for a pair timed together less than three times."""
        estimate, low, high = (math.log(x) if 0 < x < math.inf else math.nan for x in self.ratio)
        if math.isnan(low) or math.isnan(high) or self.rounds < 3:
            return math.inf
        zone = self.margin + self.indifference if self.tie_to_first else max(self.margin, self.indifference)
        room = max(estimate - math.log1p(self.margin), -math.log1p(self.margin) - estimate,
                   math.log1p(zone) - estimate)
        spread = max(high - estimate, estimate - low) / _stats.t_quantile(1 - self.alpha, self.rounds - 1)
        return self.rounds * (spread * _stats.t_quantile(1 - self.alpha, 10_000) / room) ** 2


def verdict(series: Mapping[K, Series[K]], first: K, other: K, comparisons: Comparisons[K],
            alpha: float, tails: _stats.Tails[K]) -> Verdict[K]:
    """The pair of ``first`` (the one the decision prefers) and ``other`` on the rounds both have, less those the
    machine's disturbances slowed (``tails``: :func:`_stats.machine_tails` over the look's series)."""
    ratio = _stats.ratio_interval(series[first].round_ms, series[other].round_ms, alpha=alpha,
                                  left_out=_left_out(series, first, other, tails))
    _, low, high = ratio
    margin, indifference = comparisons.margin(first, other), comparisons.indifference(first, other)
    tie_to_first = comparisons.tie_winner(first, other) == first
    clearly = first if low > 1 + margin else other if high * (1 + margin) < 1 else None
    return Verdict((first, other), ratio, min(len(series[first].round_ms), len(series[other].round_ms)), alpha,
                   clearly, clearly is None and is_open(ratio, margin, indifference, tie_to_pick=tie_to_first),
                   margin, indifference, tie_to_first)


@dataclass(frozen=True)
class Standing(Generic[K]):
    """Where the decision stands after a look of the final comparison: the candidate it would pick among all
    not dropped, the pairs it rests on still ``open`` (more rounds could still move the pick by more than the
    pair allows; one against a candidate no longer timed cannot close), and the open pairs of the pick's group
    still timed (``racing``): what past the budget may still be worth rounds."""

    pick: K | None = None
    open: list[Verdict[K]] = field(default_factory=list)
    racing: list[Verdict[K]] = field(default_factory=list)


def _open(verdicts: list[Verdict[K]], pairs: Mapping[tuple[K, K], frozenset[K] | None]) -> list[Verdict[K]]:
    """The open pairs that matter: each by itself, or while the pair it matters through is open."""
    still = {frozenset(v.pair) for v in verdicts if v.open}
    return [v for v in verdicts if v.open and (pairs[v.pair] is None or pairs[v.pair] in still)]


def look(series: dict[K, Series[K]], active: list[K], comparisons: Comparisons[K], rounds: int) -> Standing[K]:
    """One look: drop the clearly slower, mark the outpaced, settle the resolved (``active`` keeps the rest).

    In the final comparison, returns where the decision stands (:class:`Standing`).
    """
    # Each candidate is in k - 1 of the look's pairs at most, its pick's with every one not dropped included: the
    # split is fixed at the look's start, so a pair decided again after a drop spends no more than its share (on
    # the same rounds at the same alpha, the same verdict).
    alpha = _stats.ALPHA_PER_LOOK / max(1, sum(s.dropped is None and s.outpaced is None for s in series.values()) - 1)
    # Which slow rounds the machine caused is judged over every series of the comparison, not pair by pair.
    tails = _stats.machine_tails({k: s.round_ms for k, s in series.items()})

    while True:
        # A settled candidate's pairs were resolved: the open ones are decided against the leaders still timed (a
        # leader no longer timed would leave its rivals' pairs open with no rounds to close them).
        contenders = [k for k, s in series.items() if s.dropped is None and s.outpaced is None]
        timed = [k for k in contenders if k in active] or contenders
        pick, pairs = _pairs(series, timed, comparisons, tails)
        verdicts = [verdict(series, first, other, comparisons, alpha, tails) for first, other in pairs]
        fallen = [(v, v.clearly) for v in verdicts if v.clearly is not None]
        for one, slower in fallen:
            faster = one.pair[1] if slower == one.pair[0] else one.pair[0]
            estimate, low, high = one.ratio if slower == one.pair[0] else (1 / one.ratio[0], 1 / one.ratio[2],
                                                                           1 / one.ratio[1])
            evidence = Dropped(faster, estimate, low, high, min(len(series[slower].round_ms), rounds), far_behind=False)
            if comparisons.group(slower) != comparisons.group(faster):
                _outpace(series, active, comparisons, comparisons.group(slower), evidence)
            elif series[slower].dropped is None:
                series[slower].dropped = evidence
                if slower in active:
                    active.remove(slower)
        if not fallen:
            break  # else the picks and their pairs are decided again on what is left
    racing = [v for v in _open(verdicts, pairs) if all(k in active for k in v.pair)]
    # Settled: every pair resolved (or one side no longer timed); it keeps its rounds and leaves the rounds.
    active[:] = [k for k in active if any(k in v.pair for v in racing)]
    if not comparisons.across_groups:
        return Standing()
    # Worth rounds past the budget: what can still change the pick, the open pairs of its group and of each
    # group whose pick is in an open pair with it (that group's pick may change too).
    contending = {comparisons.group(k) for v in racing if pick in v.pair for k in v.pair} | {comparisons.group(pick)}
    racing = [v for v in racing if all(comparisons.group(k) in contending for k in v.pair)]
    # The decision's pick (one settled may be it), and what it rests on: its pair with each candidate of its
    # group and with each other group's pick.
    pick, pairs = _pairs(series, contenders, comparisons, tails)
    verdicts = [verdict(series, first, other, comparisons, alpha, tails) for first, other in pairs]
    return Standing(pick, [v for v in _open(verdicts, pairs) if v.pair[0] == pick], racing)


__all__ = ["Comparisons", "Dropped", "K", "Series", "Standing", "Verdict", "drop_far_behind", "look", "ranked",
           "verdict"]
