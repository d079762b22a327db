"""The interleaved sequential loop on a fake clock: deterministic, no wall time involved."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable, Iterator, Mapping

import pytest

from autotune import _stats
from autotune._lab.looks import look
from autotune._lab.measure import (
    Comparisons,
    Interleaved,
    MeasureSettings,
    Series,
    Watch,
    control_shifted,
    interleave,
    noise,
    per_step_s,
    timed,
    warm_up,
)
from autotune._lab.retime import answered, faster_by_margin
from autotune._lab.retime import comparisons as canary_pairs
from autotune._records import Candidate, MachineLoad


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStep:
    """Advances the fake clock by its next step time: a deterministic stand-in for a training step."""

    asynchronous = False

    def __init__(self, clock: FakeClock, times_s: Iterator[float]) -> None:
        self.clock = clock
        self.times_s = times_s
        self.steps = 0
        self.selections = 0

    def run(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.steps += 1
            self.clock.now += next(self.times_s)

    def selected(self) -> contextlib.AbstractContextManager[None]:
        self.selections += 1
        return contextlib.nullcontext()


def jittered(step_s: float, jitter: float = 0.02, phase: int = 0) -> Iterator[float]:
    pattern = [1.0, 1 + jitter, 1 - jitter, 1 + jitter / 2, 1 - jitter / 2, 1 + jitter / 3, 1 - jitter / 3]
    return (step_s * factor for factor in itertools.islice(itertools.cycle(pattern), phase, None))


SETTINGS = MeasureSettings(budget_s=5.0, round_min_s=0.0)
#: one device's settings of the same math: no margin, the faster wins a tie
SAME_MATH: Comparisons[str] = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0)
#: everything is one group (one device) with a 3% margin and ties to fp32, as precisions on one device are
ONE_DEVICE: Comparisons[str] = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.03,
                                           tie_winner=lambda a, b: "fp32" if "fp32" in (a, b) else None)


def _cpu_then_fp32(a: str, b: str) -> str | None:
    prefix = "cpu " if a.split()[0] != b.split()[0] else ""
    return next((k for k in (a, b) if k.startswith(prefix) and (prefix or k.endswith(" fp32"))), None)


#: "device precision" keys, grouped by device, the final comparison's way: a tie goes to the CPU, then fp32
BY_DEVICE: Comparisons[str] = Comparisons(group=lambda key: key.split()[0], margin=lambda a, b: 0.03,
                                          across_groups=True, tie_winner=_cpu_then_fp32)


def _run(step_times: dict[str, Iterator[float]], control: Iterator[float] | None = None,
         settings: MeasureSettings = SETTINGS, comparisons: Comparisons[str] = ONE_DEVICE,
         estimate_s: dict[str, float] | None = None,
         answered: Callable[[Mapping[str, Series[str]]], bool] | None = None, watch: Watch | None = None,
         ) -> tuple[Interleaved[str], dict[str, FakeStep]]:
    clock = FakeClock()
    steps = {name: FakeStep(clock, times) for name, times in step_times.items()}
    control_step = FakeStep(clock, control or itertools.repeat(0.001))
    estimates = {k: 0.01 for k in steps} | (estimate_s or {})
    result = interleave(steps, estimate_s=estimates, control=control_step, clock=clock,
                        settings=settings, comparisons=comparisons, settle=lambda s: None, answered=answered,
                        watch=watch)
    return result, steps


def test_a_2x_winner_is_found_at_the_first_look_and_the_loser_keeps_its_evidence() -> None:
    result, steps = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)})
    assert result.rounds == _stats.LOOKS[0]
    dropped = result.series["fp32"].dropped
    assert dropped is not None and dropped.by == "bf16" and dropped.low > 1.03 and dropped.rounds == 3
    assert steps["fp32"].steps == _stats.LOOKS[0]


def test_a_100x_slower_candidate_costs_one_step() -> None:
    result, steps = _run({"fp32": jittered(0.1), "bf16": jittered(0.05), "fp16": jittered(10.0)},
                         settings=MeasureSettings(budget_s=30.0, round_min_s=0.0),
                         estimate_s={"fp32": 0.1, "bf16": 0.05, "fp16": 10.0})
    assert steps["fp16"].steps == 1
    dropped = result.series["fp16"].dropped
    assert dropped is not None and dropped.far_behind and dropped.estimate == pytest.approx(200.0)


def test_one_disturbed_first_round_does_not_push_a_candidate_out() -> None:
    hiccup = itertools.chain([0.5], jittered(0.1))  # a 5x hiccup in round 1; its warm-up said 0.1 s
    result, _ = _run({"fp32": hiccup, "bf16": jittered(0.1, phase=2)}, estimate_s={"fp32": 0.1, "bf16": 0.1})
    assert result.series["fp32"].dropped is None


def test_a_leaders_disturbed_first_round_does_not_keep_a_device_10x_behind_in() -> None:
    # Another program on the cores: the GPU's first round 4x its warm-up's 10 ms. Against that round the CPU
    # would be 2.5x behind and timed on for the stage (in the final comparison too, round after dear round).
    gpu = itertools.chain([0.04], jittered(0.01))
    result, steps = _run({"cpu fp32": jittered(0.1), "cuda fp32": gpu}, comparisons=BY_DEVICE,
                         estimate_s={"cpu fp32": 0.1, "cuda fp32": 0.01})
    outpaced = result.series["cpu fp32"].outpaced
    assert outpaced is not None and outpaced.far_behind and steps["cpu fp32"].steps == 1


def test_equal_candidates_run_to_the_budget_without_a_verdict() -> None:
    result, _ = _run({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)},
                     settings=MeasureSettings(budget_s=2.0, round_min_s=0.0))
    assert all(s.dropped is None for s in result.series.values())
    assert result.rounds in _stats.LOOKS and result.rounds > _stats.LOOKS[0]
    assert result.elapsed_s >= 2.0


def test_a_tie_settled_tightly_stops_before_the_budget() -> None:
    result, _ = _run({"fp32": jittered(0.1, 0.001), "bf16": jittered(0.1, 0.001, phase=3)})
    assert result.rounds < SETTINGS.max_rounds
    assert result.elapsed_s < SETTINGS.budget_s


def test_a_near_tie_that_speed_decides_stops_once_either_pick_is_within_1pct() -> None:
    # channels_last and contiguous 0.8% apart: the faster estimate is picked, and once the slower cannot be
    # more than 1% faster, more rounds cannot change the pick by more than that (before, they went on until
    # the interval cleared 1: 22 rounds here, far more at a real machine's noise).
    settings = MeasureSettings(budget_s=20.0, round_min_s=0.0)
    by_speed, _ = _run({"contiguous": jittered(0.1008, 0.01), "channels_last": jittered(0.1, 0.01, phase=3)},
                       settings=settings, comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0))
    assert by_speed.rounds <= 10 and all(s.dropped is None for s in by_speed.series.values())


def test_timing_stops_only_at_looks() -> None:
    for budget_s in (0.5, 0.9, 1.3, 2.2):
        result, _ = _run({"a": jittered(0.1, 0.05), "b": jittered(0.1, 0.05, phase=2)},
                         settings=MeasureSettings(budget_s=budget_s, round_min_s=0.0))
        assert result.rounds in _stats.LOOKS


def test_each_round_runs_the_candidates_in_a_seeded_random_order() -> None:
    # A B C / C B A would never put B first or last: every candidate takes every position, and the same seed
    # gives the same order.
    def orders(seed: int) -> list[list[str]]:
        clock = FakeClock()
        ran: list[str] = []

        class Recording(FakeStep):
            def __init__(self, name: str) -> None:
                super().__init__(clock, jittered(0.01, 0.3, phase="abc".index(name)))
                self.name = name

            def run(self, steps: int = 1) -> None:
                ran.append(self.name)
                super().run(steps)

        steps = {name: Recording(name) for name in "abc"}  # noisy equals: open for many rounds
        interleave(steps, estimate_s=dict.fromkeys("abc", 0.01), control=FakeStep(clock, itertools.repeat(0.001)),
                   clock=clock, settings=MeasureSettings(budget_s=0.6, round_min_s=0.0, order_seed=seed),
                   comparisons=ONE_DEVICE, settle=lambda s: None)
        return [ran[i:i + 3] for i in range(0, 3 * 20, 3)]

    rounds = orders(0)
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert all({r[position] for r in rounds} == {"a", "b", "c"} for position in range(3))
    assert orders(0) == rounds and orders(1) != rounds


def test_settings_apply_outside_the_timed_steps_once_per_round() -> None:
    result, steps = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)})
    assert steps["bf16"].selections == result.rounds  # one selection per round, not per step


def test_a_drifting_control_doubles_the_budget_and_flags_the_result() -> None:
    settings = MeasureSettings(budget_s=1.0, round_min_s=0.0)
    steady, _ = _run({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, settings=settings)
    drifting = (0.001 * (1 + 0.05 * i) for i in itertools.count())
    noisy, _ = _run({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, control=drifting,
                    settings=settings)
    assert noisy.noisy and not steady.noisy
    assert steady.elapsed_s < 2.0 <= noisy.elapsed_s


class Reported:
    """The operating system's view (its boundary): every window reports ``load``."""

    def __init__(self, load: MachineLoad) -> None:
        self.load = load

    def open(self) -> Reported:
        return self

    def so_far(self) -> MachineLoad:
        return self.load

    def close(self) -> MachineLoad:
        return self.load

    def wait_for_host(self) -> float:
        return 0.0


@pytest.mark.parametrize(("other_cores", "steal", "causes"), [
    (0.9, 0.0, ["other_processes"]),
    (0.3, 0.0, []),
    (0.1, 0.12, ["steal"]),
], ids=["another-process", "a-little-cpu-time-elsewhere", "the-hypervisor"])
def test_what_the_operating_system_saw_flags_the_result_and_doubles_the_budget(
        other_cores: float, steal: float, causes: list[str]) -> None:
    # A steady control: only the operating system's evidence can say the machine was busy (of 2 cores here).
    settings = MeasureSettings(budget_s=1.0, round_min_s=0.0)
    seen = MachineLoad(window_s=1.0, other_cores=other_cores, other_share=other_cores / 2, steal=steal)
    result, _ = _run({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, settings=settings,
                     watch=Reported(seen))
    assert result.load == seen
    assert noise(result.control_ms, [seen], settings) == causes
    assert result.noisy == bool(causes)
    assert (result.elapsed_s >= 2.0) == bool(causes)


def test_a_control_is_judged_against_its_own_noise_not_a_fixed_spread() -> None:
    rng = random.Random(0)
    jittery = [1.0 + rng.gauss(0.0, 0.08) for _ in range(40)]  # 8% a round, around one level
    assert _stats.spread(jittery) > 0.10  # past the fixed 10% the spread used to be judged by
    assert not control_shifted(jittery, MeasureSettings())
    assert control_shifted(jittery[:20] + [1.8 * x for x in jittery[20:]], MeasureSettings())  # another level
    assert control_shifted([1.0 + 0.01 * i for i in range(40)], MeasureSettings())  # a steady ramp, 40% in all
    assert not control_shifted([1.0 + 0.001 * i for i in range(40)], MeasureSettings())  # ... 4%: too little


def test_a_steady_control_is_not_noisy() -> None:
    result, _ = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)}, control=jittered(0.001, 0.02))
    assert not result.noisy


def test_across_devices_the_slower_device_is_outpaced_not_dropped() -> None:
    by_device = BY_DEVICE
    result, steps = _run({"cpu fp32": jittered(0.2), "cuda fp32": jittered(0.1, 0.05),
                          "cuda bf16": jittered(0.099, 0.05, phase=3)}, comparisons=by_device)
    cpu = result.series["cpu fp32"]
    assert cpu.dropped is None and cpu.outpaced is not None and cpu.outpaced.low > 1.03
    assert steps["cpu fp32"].steps < steps["cuda fp32"].steps  # settled once outpaced


def test_past_the_budget_the_final_comparison_times_only_what_can_still_change_the_pick() -> None:
    # The CPU's tie against cuda (10% faster) is timed on; xpu's own pair is open too, but xpu's pick is resolved
    # against the CPU's within the budget: whichever xpu candidate it is, the pick does not change.
    result, steps = _run({"cpu a": jittered(0.1, 0.05), "cuda a": jittered(0.09, 0.05, phase=1),
                          "xpu a": jittered(0.1, 0.05, phase=2), "xpu b": jittered(0.1, 0.05, phase=4)},
                         settings=MeasureSettings(budget_s=1.0, round_min_s=0.0), comparisons=BY_DEVICE)
    assert result.elapsed_s > 1.0
    assert steps["cpu a"].steps == steps["cuda a"].steps > max(steps["xpu a"].steps, steps["xpu b"].steps)


def test_a_gap_the_final_comparison_cannot_resolve_by_its_cap_is_not_final() -> None:
    # bf16 on the GPU looks 2x faster than the CPU's fp32 but the rounds are wrecked (another process on the
    # cores: one round 0.3x, the next 4x): at the cap the CPU wins the tie against the estimate. Flagged, so the
    # next calibrate() measures again; a clean 2x gap is resolved and not flagged.
    wrecked = itertools.cycle([1.0, 4.0, 0.3, 2.5, 0.5, 3.0, 0.4])
    settings = MeasureSettings(budget_s=0.5, round_min_s=0.0)
    noisy, _ = _run({"cpu fp32": (0.2 * f for f in wrecked), "cuda bf16": jittered(0.1, 0.05)},
                    settings=settings, comparisons=BY_DEVICE)
    assert noisy.unresolved_gap and all(s.outpaced is None for s in noisy.series.values())
    clean, _ = _run({"cpu fp32": jittered(0.2, 0.05), "cuda bf16": jittered(0.1, 0.05)}, settings=settings,
                    comparisons=BY_DEVICE)
    assert not clean.unresolved_gap and clean.series["cpu fp32"].outpaced is not None


def test_round_length_adapts_to_tiny_steps() -> None:
    clock = FakeClock()
    steps = {"tiny": FakeStep(clock, itertools.repeat(0.0005))}
    result = interleave(steps, estimate_s={"tiny": 0.0005}, control=FakeStep(clock, itertools.repeat(0.001)),
                        clock=clock, settings=MeasureSettings(budget_s=1.0, round_min_s=0.01), comparisons=ONE_DEVICE,
                        settle=lambda s: None)
    assert result.series["tiny"].steps_per_round == 20


def test_warm_up_runs_until_three_steps_agree() -> None:
    clock = FakeClock()
    settling = iter([0.5, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1])
    step = FakeStep(clock, settling)
    times = warm_up(step, clock, [], MeasureSettings())
    assert times[-3:] == [pytest.approx(0.1)] * 3
    assert step.steps == 6


def test_a_candidate_timed_again_warms_up_afresh_until_a_step_is_near_its_steady_time() -> None:
    clock = FakeClock()
    # Three steps that agree among themselves but sit 20% above the 0.1 s it ran at before (a GPU's clocks down
    # after others ran): not warm yet. Its own earlier steps do not count.
    step = FakeStep(clock, iter([0.12, 0.12, 0.12, 0.104, 0.1]))
    times = warm_up(step, clock, [0.1, 0.1, 0.1], MeasureSettings(), steady_s=0.1)
    assert times == [pytest.approx(t) for t in (0.12, 0.12, 0.12, 0.104)]


class QueueStep:
    """An accelerator's step on a fake clock: the host launches a step in ``launch_s``, the device runs it in
    ``device_s`` once launched and once the step before it is done; a loop overlaps the two. ``cold_s``: what the
    first step after another candidate's costs the device more (its clocks and caches). Its events time the
    steps' ends on the device."""

    asynchronous = True

    def __init__(self, clock: FakeClock, launch_s: float, device_s: float, cold_s: float = 0.0) -> None:
        self.clock, self.launch_s, self.device_s, self.cold_s = clock, launch_s, device_s, cold_s
        self.cold = True
        self.steps = 0

    def run(self, steps: int = 1) -> None:
        self.span_from_here(steps)

    def span(self, steps: int) -> list[float]:
        return self.span_from_here(steps + 1)

    def span_from_here(self, steps: int) -> list[float]:
        launched = done = self.clock.now
        ends = []
        for _ in range(steps):
            launched += self.launch_s
            done = max(done, launched) + self.device_s + (self.cold_s if self.cold else 0.0)
            ends.append(done)
            self.cold = False
            self.steps += 1
        self.clock.now = done
        return [later - first for first, later in itertools.pairwise(ends)]

    @contextlib.contextmanager
    def selected(self) -> Iterator[None]:
        yield
        self.cold = True  # another candidate runs next


@pytest.mark.parametrize(("launch_s", "device_s"), [(0.0026, 0.002), (0.001, 0.004), (0.0029, 0.001)])
def test_asynchronous_steps_are_timed_at_a_loops_speed(launch_s: float, device_s: float) -> None:
    clock = FakeClock()
    step = QueueStep(clock, launch_s, device_s)
    assert timed(step, clock) == pytest.approx(launch_s + device_s)  # synchronised alone, they add up
    # A loop's step takes the longer of the two: each step after a span's first.
    assert per_step_s(step, clock, 4, spans=True) == [pytest.approx(max(launch_s, device_s))] * 4
    assert step.steps == 1 + 1 + 4


def test_a_cold_first_step_after_another_candidate_is_left_out() -> None:
    # The device's first step after another candidate's is 1 ms slower: not a loop's step, so in no figure.
    clock = FakeClock()
    step = QueueStep(clock, 0.001, 0.004, cold_s=0.001)
    with step.selected():
        assert per_step_s(step, clock, 2, spans=True) == [pytest.approx(0.004)] * 2


@pytest.mark.parametrize(("launch_s", "device_s"), [(0.0, 0.004), (0.0004, 0.004), (0.0026, 0.002)],
                         ids=["device-bound", "4pct-overlap", "launch-bound"])
def test_every_asynchronous_candidate_is_timed_the_same_way(launch_s: float, device_s: float) -> None:
    # Lone steps for one, spans for the other meant two estimators in one pair: now each of them step by step
    # inside spans, whatever its overlap.
    clock = FakeClock()
    steps = {"a": QueueStep(clock, launch_s, device_s), "b": QueueStep(clock, 0.001, 0.004)}
    result = interleave(steps, estimate_s={"a": launch_s + device_s, "b": 0.005},
                        control=FakeStep(clock, itertools.repeat(0.001)), clock=clock,
                        settings=MeasureSettings(budget_s=0.5), comparisons=ONE_DEVICE, settle=lambda s: None)
    assert result.series["a"].round_ms == [pytest.approx(1000 * max(launch_s, device_s))] * result.rounds
    assert result.series["b"].round_ms == [pytest.approx(4.0)] * result.rounds


def test_a_spans_first_step_does_not_count_against_the_budget() -> None:
    # Heavy steps: a span of two steps gives one figure. Counted against the budget, the untimed first step
    # would halve the rounds an accelerator's candidates get next to the same steps timed alone; counted in what
    # a stage reports spent, it would shrink the final comparison's budget (what the stages leave of it).
    def rounds(step: Callable[[FakeClock], object]) -> tuple[int, float]:
        clock = FakeClock()
        pair = {"a": step(clock), "b": step(clock)}
        result = interleave(pair, estimate_s={"a": 0.05, "b": 0.05},  # type: ignore[arg-type]
                            control=FakeStep(clock, itertools.repeat(0.001)), clock=clock,
                            settings=MeasureSettings(budget_s=2.0), comparisons=ONE_DEVICE, settle=lambda s: None)
        return result.rounds, result.elapsed_s

    spans = rounds(lambda clock: QueueStep(clock, 0.0, 0.05))
    assert spans == pytest.approx(rounds(lambda clock: FakeStep(clock, jittered(0.05, jitter=0.0))))


def test_an_asynchronous_candidate_timed_again_warms_up_in_spans() -> None:
    # Its steady time was measured in spans (a loop's 2.6 ms): a lone step (4.6 ms) would never come within 5% of
    # it, and every re-warm would take the full eight steps.
    clock = FakeClock()
    step = QueueStep(clock, 0.0026, 0.002)
    times = warm_up(step, clock, [0.0046] * 3, MeasureSettings(), steady_s=0.0026)
    assert times == [pytest.approx(0.0026)]
    assert step.steps == 1 + 2  # a span's untimed first step and two timed ones (3 ms at least)


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
    result, _ = _run({"a": itertools.chain([0.1] * 3, itertools.repeat(0.11)), "b": itertools.repeat(0.1001),
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
    steady, _ = _run({"fp32": itertools.repeat(0.1), "bf16": itertools.repeat(0.1)})
    drifting = (0.001 * (1 + 0.05 * i) for i in itertools.count())
    noisy, _ = _run({"fp32": itertools.repeat(0.1), "bf16": itertools.repeat(0.1)}, control=drifting)
    assert steady.rounds == _stats.LOOKS[0]
    assert noisy.rounds >= 2 * _stats.LOOKS[0]


def test_the_canarys_question_answered_at_a_look_stops_the_rounds() -> None:
    # A runner-up 1% behind the pick: resolving that near-tie takes the whole budget, but the canary only asks
    # whether anyone is more than the margin faster than the pick, which a few rounds answer (no).
    def steps() -> dict[str, Iterator[float]]:
        return {"fp32": jittered(0.2), "pick": jittered(0.1, 0.01), "runner": jittered(0.101, 0.01, phase=3)}

    pairs, _ = _run(steps(), comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0))
    canary, _ = _run(steps(), comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0),
                     answered=answered("pick"))
    assert canary.rounds in _stats.LOOKS and canary.rounds < pairs.rounds
    # ... and one clearly faster than the pick ends the rounds at once, at the first look
    faster = {"pick": jittered(0.1, 0.01), "runner": jittered(0.05, 0.01, phase=3)}
    assert _run(faster, answered=answered("pick"))[0].rounds == _stats.LOOKS[0]


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
    result, _ = _run(steps, comparisons=canary_pairs(pick), answered=answered(pick),  # type: ignore[arg-type]
                     settings=MeasureSettings(budget_s=5.0, round_min_s=0.0, max_rounds=6))
    assert faster_by_margin(result.series[runner].round_ms, result.series[pick].round_ms) is True


def test_the_control_runs_every_round_of_heavy_steps_and_every_few_of_cheap_ones() -> None:
    # the control (3 ms here) would triple a round of two 0.5 ms steps; past the first look it takes a quarter
    cheap, _ = _run({"fp32": jittered(0.0005, jitter=0.2), "bf16": jittered(0.00047, jitter=0.2, phase=3)})
    heavy, _ = _run({"fp32": jittered(0.02, jitter=0.2), "bf16": jittered(0.0188, jitter=0.2, phase=3)})
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
        return _run({"fp32": jittered(step_s, 0.1), "bf16": jittered(step_s / 1.02, 0.1, phase=3)},
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
    result, _ = _run({"default": (0.0005 * noise.lognormvariate(0, 0.5) for _ in itertools.count()),
                      "1 thread": (0.0005 / 1.06 * noise.lognormvariate(0, 0.5) for _ in itertools.count())},
                     settings=MeasureSettings(budget_s=0.5, round_min_s=0.0), comparisons=threads)
    dropped = result.series["default"].dropped
    assert result.rounds > 275 and dropped is not None and dropped.by == "1 thread"


THREADS: Comparisons[str] = Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0, across_groups=True,
                                        indifference=lambda a, b: 0.03,
                                        tie_winner=lambda a, b: "default" if "default" in (a, b) else None)


def test_a_same_math_gain_beyond_the_indifference_is_timed_past_the_budget_until_found() -> None:
    # One thread 4.5% faster than torch's default on noisy heavy steps: not left to the default's tie.
    result, _ = _run({"default": jittered(0.1, 0.03), "1 thread": jittered(0.1 / 1.045, 0.03, phase=3)},
                     settings=MeasureSettings(budget_s=1.0, round_min_s=0.0), comparisons=THREADS)
    assert result.series["default"].dropped is not None and result.elapsed_s > 1.0


def test_a_same_math_near_tie_within_the_indifference_stays_in_the_budget() -> None:
    result, _ = _run({"default": jittered(0.1, 0.03), "1 thread": jittered(0.1 / 1.01, 0.03, phase=3)},
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
