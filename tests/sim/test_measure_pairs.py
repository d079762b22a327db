"""The pairs the interleaved loop compares, on a fake clock: looks and their quantiles, paired estimates over each
pair's own rounds, disturbances told from candidates, the canary's question, close calls past the budget.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest
from measure_for_tests import (
    SAME_MATH,
    jittered,
    run_interleaved,
)

from autotune import _stats
from autotune._lab.check import answered, faster_by_margin
from autotune._lab.check import comparisons as canary_pairs
from autotune._lab.looks import look
from autotune._lab.measure import (
    Comparisons,
    Interleaved,
    MeasureSettings,
    Series,
)
from autotune._records import Candidate


def test_max_rounds_must_be_a_look() -> None:
    with pytest.raises(ValueError, match="must be one of the looks"):
        MeasureSettings(max_rounds=7)


@pytest.mark.parametrize(("p", "df", "expected"), [(0.975, 1, 12.706), (0.975, 10, 2.228), (0.995, 20, 2.845)])
def test_t_quantiles_match_the_tables(p: float, df: int, expected: float) -> None:
    assert _stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-3)


def test_leaders_are_ranked_on_paired_estimates_over_each_pairs_own_rounds() -> None:
    # "b" ties "a" tightly (0.1% behind) and settles at the first look; "a" then slows to 0.11 s. Ranked on medians over
    # different rounds, b's early rounds would make it the leader, and since b is no longer timed, a's and c's
    # open comparison would end there. Ranked on paired estimates among the candidates still timed, it goes on.
    result, _ = run_interleaved({"a": itertools.chain([0.1] * 3, itertools.repeat(0.11)), "b": itertools.repeat(0.1001),
                      "c": jittered(0.101, 0.2)})
    assert len(result.series["b"].round_ms) == _stats.LOOKS[0]
    assert result.rounds > 6
    assert result.series["c"].dropped is None


def test_a_candidate_resolved_against_the_pick_stays_timed_while_the_typically_fastest_may_beat_it() -> None:
    # "fast" is 4.5% faster than "a" on every round but one, 3x slow: the ratio of means puts it behind "a", the
    # pick, in the first looks. "b", as fast as a, is resolved against a then; paired only with a (the fastest by
    # the means too), it would leave the rounds, and its pair with "fast", which drops a later, stay open on
    # four rounds, the slow one in them.
    a = [10.0, 10.1, 9.9, 10.05]
    b = [x * f for x, f in zip(a, [1.001, 0.999, 1.0, 1.0005], strict=True)]
    fast = [x / 1.045 * (3 if i == 1 else 1) for i, x in enumerate(a)]
    series = {k: Series[str](steps_per_round=1, round_ms=v) for k, v in {"a": a, "b": b, "fast": fast}.items()}
    assert _stats.ratio_interval(fast, a)[0] > 1
    active = list(series)
    look(series, active, Comparisons(group=lambda key: "cpu", margin=lambda x, y: 0.0,
                                     tie_winner=lambda x, y: "a" if "a" in (x, y) else None), len(a))
    assert "b" in active


def test_a_candidates_own_periodic_stall_counts_in_its_ratio_and_its_ranking() -> None:
    # "b" is 10% faster on 7 rounds of 8 and stalls 2.8x on the 8th: its loop pays 1.1x "a"'s time per step.
    a = [10.0] * 16
    b = [9.0 if i % 8 else 25.0 for i in range(1, 17)]
    estimate, low, high = _stats.ratio_interval(b, a)
    assert estimate == pytest.approx(1.1)
    assert low < 1.1 < high
    scores = _stats.paired_scores({"a": a, "b": b})
    assert scores["b"] == pytest.approx(1.1 * scores["a"])


def test_a_disturbance_both_candidates_saw_cancels_in_the_pair() -> None:
    # A burst doubles both candidates' steps in three rounds: the ratio and its spread stay those of the quiet
    # rounds, where the same burst hitting one candidate only widens the interval.
    quiet_a = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.2, 9.8, 10.1, 9.9]
    quiet_b = [0.9 * x * (1 + 0.01 * (-1) ** i) for i, x in enumerate(quiet_a)]
    burst = [2.0 if i in (3, 4, 5) else 1.0 for i in range(10)]
    both = _stats.ratio_interval([x * f for x, f in zip(quiet_b, burst, strict=True)],
                                 [x * f for x, f in zip(quiet_a, burst, strict=True)])
    alone = _stats.ratio_interval([x * f for x, f in zip(quiet_b, burst, strict=True)], quiet_a)
    assert both[0] == pytest.approx(0.9, rel=0.01)
    assert both[2] < 0.93 < alone[2]


def test_the_machines_slow_rounds_are_told_from_every_candidate_of_a_comparison() -> None:
    # Another program slows one round of "a" 3x and two of "c"; "b" happens to be spared. The pair a, b alone
    # cannot tell a's slow round from a stall of its own and keeps it; over the whole comparison the machine's
    # hits show in c too, at a rate a's is not clearly above, and the round is left out of the pair.
    quiet = [10.0 * (1 + 0.01 * ((7 * i) % 5 - 2)) for i in range(20)]
    a = [3 * x if i == 3 else x for i, x in enumerate(quiet)]
    b = [0.9 * x * (1 + 0.005 * (-1) ** i) for i, x in enumerate(quiet)]
    c = [3 * x if i in (7, 15) else x * (1 - 0.005 * (-1) ** i) for i, x in enumerate(quiet)]
    assert _stats.machine_tails({"a": a, "b": b})["a"] is None
    pooled = _stats.machine_tails({"a": a, "b": b, "c": c})
    assert pooled == {"a": frozenset({3}), "b": frozenset(), "c": frozenset({7, 15})}
    alone = _stats.ratio_interval(b, a)
    told = _stats.ratio_interval(b, a, left_out=_stats.left_out(pooled, "b", "a", 20))
    assert told[0] == pytest.approx(0.9, rel=0.01)
    assert told[0] > alone[0] + 0.05
    assert told[2] - told[1] < (alone[2] - alone[1]) / 5
    # A stall of b's own every 8th round while the others' rounds are clean stays in its mean.
    stalled = [2.8 * x if i % 8 == 0 else x for i, x in enumerate(b)]
    assert _stats.machine_tails({"a": quiet, "b": stalled, "c": [x * 1.01 for x in quiet]})["b"] is None


def test_another_candidates_noise_does_not_make_a_stall_of_ones_own_the_machines() -> None:
    # bf16 stalls 2.8x in round 4, its own; fp32's round 6 is 8% slower than usual against bf16, where rounds
    # agree within 2%: beyond five robust deviations of the pair, but noise. Counted as a hit of the machine's,
    # it gave both one slow round at the same rate, and bf16's stall was left out of their pair: fp32 lost a
    # pair its loop wins (a periodic stall's scenario, seed 92).
    fp32 = [9.9, 9.5, 9.5, 10.3, 10.4, 9.6, 10.3, 9.9, 9.8, 9.7]
    bf16 = [9.2, 9.0, 8.9, 9.3, 25.2, 8.6, 8.6, 9.3, 9.1, 9.1]
    tails = _stats.machine_tails({"fp32": fp32, "bf16": bf16})
    assert tails == {"fp32": frozenset(), "bf16": None}
    assert _stats.ratio_interval(bf16, fp32, left_out=_stats.left_out(tails, "bf16", "fp32", 10))[0] > 1.05


def test_a_disturbance_that_slowed_two_candidates_of_a_round_is_left_out_of_their_pairs_with_a_third() -> None:
    # Another program slows round 5 of both "a" and "b" 3x (not slow in their pair), round 12 of a and two rounds
    # of "c": the machine's, left out of a's and b's pairs with c, as c's are.
    quiet = [10.0 * (1 + 0.01 * ((7 * i) % 5 - 2)) for i in range(20)]
    a = [3 * x if i in (5, 12) else x for i, x in enumerate(quiet)]
    b = [3 * 0.95 * x if i == 5 else 0.95 * x * (1 + 0.005 * (-1) ** i) for i, x in enumerate(quiet)]
    c = [3 * 0.9 * x if i in (9, 14) else 0.9 * x * (1 - 0.005 * (-1) ** i) for i, x in enumerate(quiet)]
    pooled = _stats.machine_tails({"a": a, "b": b, "c": c})
    for one in ("a", "b"):
        out = _stats.left_out(pooled, one, "c", 20)
        assert out == {5, 9, 14} | ({12} if one == "a" else set())
        estimate = _stats.ratio_interval(a if one == "a" else b, c, left_out=out)[0]
        assert estimate == pytest.approx(1 / 0.9 if one == "a" else 0.95 / 0.9, rel=0.01)


def test_each_pair_spends_its_alpha_once_per_look() -> None:
    # "d" is clearly slower at the first pass of the look; "b" is not at the look's split over its 3 pairs, but
    # would be at the split over the 2 left after d's drop: tested again at that larger alpha, it would be
    # dropped on the same rounds.
    a = [10.0, 10.3, 9.7, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7]
    c = [x * f for x, f in zip(a, [1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.02, 0.98], strict=True)]
    b = [x * f for x, f in zip(a, [1.03, 0.97, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97, 1.0], strict=True)]
    wide, narrow = (_stats.ratio_interval(b, a, alpha=_stats.ALPHA_PER_LOOK / k)[1] for k in (3, 2))
    b = [x / (wide * narrow) ** 0.5 for x in b]  # slower than a by just enough for the larger alpha only
    assert _stats.ratio_interval(b, a, alpha=_stats.ALPHA_PER_LOOK / 3)[1] < 1
    assert _stats.ratio_interval(b, a, alpha=_stats.ALPHA_PER_LOOK / 2)[1] > 1
    series = {k: Series[str](steps_per_round=1, round_ms=v) for k, v in
              {"a": a, "b": b, "c": c, "d": [3 * x for x in a]}.items()}
    active = list(series)
    look(series, active, SAME_MATH, len(a))
    assert series["d"].dropped is not None
    assert series["b"].dropped is None


def test_a_drifting_control_gives_every_pair_twice_the_first_looks_rounds() -> None:
    steady, _ = run_interleaved({"fp32": itertools.repeat(0.1), "bf16": itertools.repeat(0.1)})
    drifting = (0.001 * (1 + 0.05 * i) for i in itertools.count())
    noisy, _ = run_interleaved({"fp32": itertools.repeat(0.1), "bf16": itertools.repeat(0.1)}, control=drifting)
    assert steady.rounds == _stats.LOOKS[0]
    assert noisy.rounds >= 2 * _stats.LOOKS[0]


def test_the_canarys_question_answered_at_a_look_stops_the_rounds() -> None:
    # A runner-up 1% behind the pick: resolving that near-tie takes the whole budget, but the canary only asks
    # whether anyone is more than the margin faster than the pick, which a few rounds answer (no).
    def steps() -> dict[str, Iterator[float]]:
        return {"fp32": jittered(0.2), "pick": jittered(0.1, 0.01), "runner": jittered(0.101, 0.01, phase=3)}

    pairs, _ = run_interleaved(steps(), comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0))
    canary, _ = run_interleaved(steps(), comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0),
                     answered=answered("pick"))
    assert canary.rounds in _stats.LOOKS and canary.rounds < pairs.rounds
    # ... and one clearly faster than the pick ends the rounds at once, at the first look
    faster = {"pick": jittered(0.1, 0.01), "runner": jittered(0.05, 0.01, phase=3)}
    assert run_interleaved(faster, answered=answered("pick"))[0].rounds == _stats.LOOKS[0]


@pytest.mark.parametrize("runner", [Candidate(device="cpu", precision="fp32"),
                                    Candidate(device="cpu", precision="bf16-mixed", num_threads=1)])
def test_the_canary_times_a_candidate_ahead_of_the_pick_until_it_is_clearly_beyond_the_margin(
        runner: Candidate) -> None:
    # 8% ahead of the pick: the pair is not settled once the pick cannot be 3% faster (a review found the
    # canary answering "ok" that way), nor once the pick is clearly slower at all (another thread count: the
    # same math, which a calibration's pairs give no margin); it goes on until the other is clearly more than
    # 3% faster: the canary asks one question of every pair.
    pick = Candidate(device="cpu", precision="bf16-mixed")
    steps = {pick: jittered(0.1, 0.01), runner: jittered(0.092, 0.01, phase=3)}
    result, _ = run_interleaved(steps, comparisons=canary_pairs(pick), answered=answered(pick),  # type: ignore[arg-type]
                     settings=MeasureSettings(budget_s=5.0, round_min_s=0.0, max_rounds=6))
    assert faster_by_margin(result.series[runner].round_ms, result.series[pick].round_ms) is True


def test_the_control_runs_every_round_of_heavy_steps_and_every_few_of_cheap_ones() -> None:
    # the control (3 ms here) would triple a round of two 0.5 ms steps; past the first look it takes a quarter
    cheap, _ = run_interleaved({"fp32": jittered(0.0005, jitter=0.2), "bf16": jittered(0.00047, jitter=0.2, phase=3)})
    heavy, _ = run_interleaved({"fp32": jittered(0.02, jitter=0.2), "bf16": jittered(0.0188, jitter=0.2, phase=3)})
    assert cheap.rounds > 2 * _stats.LOOKS[0] and heavy.rounds > _stats.LOOKS[0]
    assert _stats.LOOKS[0] < len(cheap.control_ms) < cheap.rounds / 3
    assert len(heavy.control_ms) == heavy.rounds


#: precisions on one device as the final comparison decides them: ties to fp32, a 3% margin
FINAL_ONE_DEVICE: Comparisons[str] = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.03, across_groups=True,
                                                 tie_winner=lambda a, b: "fp32" if "fp32" in (a, b) else None)


def test_a_close_call_is_timed_past_the_budget_while_its_rounds_are_cheap_and_named_open_when_they_are_dear() -> None:
    # bf16 2% faster: the tie goes to fp32 once fp32 is surely within 4% of it. Sub-millisecond rounds settle that
    # past the budget; rounds of a second cannot within the cap, so the pair is left open at once, named, and the
    # result not flagged (measuring again would leave it open again).
    def near_tie(step_s: float, budget_s: float) -> Interleaved[str]:
        return run_interleaved({"fp32": jittered(step_s, 0.1), "bf16": jittered(step_s / 1.02, 0.1, phase=3)},
                    settings=MeasureSettings(budget_s=budget_s, round_min_s=0.0), comparisons=FINAL_ONE_DEVICE)[0]

    cheap, dear = near_tie(0.001, 0.2), near_tie(0.5, 2.0)
    assert cheap.elapsed_s > 0.2 and cheap.open_pairs == [] and not cheap.unresolved_gap
    assert dear.elapsed_s < 2.0 + 1.5 and dear.open_pairs == [("fp32", "bf16")] and not dear.unresolved_gap
    assert all(s.dropped is None for r in (cheap, dear) for s in r.series.values())


def test_looks_go_past_275_rounds_for_a_cheap_close_call() -> None:
    # 1 thread 6% faster on steps that vary by 50%: these 400 rounds tell them apart; they cost 1 ms each.
    threads = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0, across_groups=True,
                          indifference=lambda a, b: 0.03,
                          tie_winner=lambda a, b: "default" if "default" in (a, b) else None)
    noise = random.Random(2)
    result, _ = run_interleaved({"default": (0.0005 * noise.lognormvariate(0, 0.5) for _ in itertools.count()),
                      "1 thread": (0.0005 / 1.06 * noise.lognormvariate(0, 0.5) for _ in itertools.count())},
                     settings=MeasureSettings(budget_s=0.5, round_min_s=0.0), comparisons=threads)
    dropped = result.series["default"].dropped
    assert result.rounds > 275 and dropped is not None and dropped.by == "1 thread"


THREADS: Comparisons[str] = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0, across_groups=True,
                                        indifference=lambda a, b: 0.03,
                                        tie_winner=lambda a, b: "default" if "default" in (a, b) else None)


def test_a_same_math_gain_beyond_the_indifference_is_timed_past_the_budget_until_found() -> None:
    # One thread 4.5% faster than torch's default on noisy heavy steps: not left to the default's tie.
    result, _ = run_interleaved({"default": jittered(0.1, 0.03), "1 thread": jittered(0.1 / 1.045, 0.03, phase=3)},
                     settings=MeasureSettings(budget_s=1.0, round_min_s=0.0), comparisons=THREADS)
    assert result.series["default"].dropped is not None and result.elapsed_s > 1.0


def test_a_same_math_near_tie_within_the_indifference_stays_in_the_budget() -> None:
    result, _ = run_interleaved({"default": jittered(0.1, 0.03), "1 thread": jittered(0.1 / 1.01, 0.03, phase=3)},
                     settings=MeasureSettings(budget_s=1.0, round_min_s=0.0), comparisons=THREADS)
    assert all(s.dropped is None for s in result.series.values())
    assert result.elapsed_s < 1.5 and not result.unresolved_gap


def test_a_throttle_reason_flags_a_candidate_only_if_its_rounds_moved() -> None:
    # Recorded shapes: rounds in ms with the reasons read after each one's sample.
    from autotune._lab.clocks import throttle_slowdown

    steady = [10.0, 10.1, 9.9, 10.0, 10.2, 9.9]
    # A power cap in force all along (a heavy bf16 load): its rounds before the final comparison ran as fast.
    assert throttle_slowdown(steady, [["power_cap"]] * 6, [10.0, 10.1, 10.0], 0.05) is None
    # A thermal event over the last three rounds, 25% slower than the first three.
    hot = [10.0, 10.1, 9.9, 12.5, 12.6, 12.4]
    found = throttle_slowdown(hot, [[], [], [], ["thermal"], ["thermal"], ["thermal"]], [10.0], 0.05)
    assert found is not None and found[0] == pytest.approx(0.25, abs=0.01) and found[1] == ["thermal"]
    # No reason reported (or no reading at all): whatever the clock did, nothing throttled.
    assert throttle_slowdown(hot, [[]] * 6, [10.0], 0.05) is None
    assert throttle_slowdown(hot, [], [10.0], 0.05) is None
    # A reason in every round and nothing to compare with: no evidence that the rounds moved.
    assert throttle_slowdown(hot, [["thermal"]] * 6, [], 0.05) is None
