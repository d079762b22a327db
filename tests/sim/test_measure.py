"""The interleaved sequential loop on a fake clock: deterministic, no wall time involved. When it stops (a look, a
verdict, the budget), the order of its rounds, its control of the machine's drift, warm-up. Asynchronous steps:
test_measure_async.py; the pairs it compares and their looks: test_measure_pairs.py.
"""

from __future__ import annotations

import itertools
import random

import pytest
from measure_for_tests import (
    BY_DEVICE,
    ONE_DEVICE,
    SETTINGS,
    FakeClock,
    FakeStep,
    jittered,
    run_interleaved,
)

from autotune import _stats
from autotune._lab.measure import (
    Comparisons,
    MeasureSettings,
    control_shifted,
    interleave,
    noise,
    warm_up,
)
from autotune._records import MachineLoad


def test_a_2x_winner_is_found_at_the_first_look_and_the_loser_keeps_its_evidence() -> None:
    result, steps = run_interleaved({"fp32": jittered(0.1), "bf16": jittered(0.05)})
    assert result.rounds == _stats.LOOKS[0]
    dropped = result.series["fp32"].dropped
    assert dropped is not None and dropped.by == "bf16" and dropped.low > 1.03 and dropped.rounds == 3
    assert steps["fp32"].steps == _stats.LOOKS[0]


def test_a_100x_slower_candidate_costs_one_step() -> None:
    result, steps = run_interleaved({"fp32": jittered(0.1), "bf16": jittered(0.05), "fp16": jittered(10.0)},
                         settings=MeasureSettings(budget_s=30.0, round_min_s=0.0),
                         estimate_s={"fp32": 0.1, "bf16": 0.05, "fp16": 10.0})
    assert steps["fp16"].steps == 1
    dropped = result.series["fp16"].dropped
    assert dropped is not None and dropped.far_behind and dropped.estimate == pytest.approx(200.0)


def test_one_disturbed_first_round_does_not_push_a_candidate_out() -> None:
    hiccup = itertools.chain([0.5], jittered(0.1))  # a 5x hiccup in round 1; its warm-up said 0.1 s
    result, _ = run_interleaved({"fp32": hiccup, "bf16": jittered(0.1, phase=2)}, estimate_s={"fp32": 0.1, "bf16": 0.1})
    assert result.series["fp32"].dropped is None


def test_a_leaders_disturbed_first_round_does_not_keep_a_device_10x_behind_in() -> None:
    # Another program on the cores: the GPU's first round 4x its warm-up's 10 ms. Against that round the CPU
    # would be 2.5x behind and timed on for the stage (in the final comparison too, round after dear round).
    gpu = itertools.chain([0.04], jittered(0.01))
    result, steps = run_interleaved({"cpu fp32": jittered(0.1), "cuda fp32": gpu}, comparisons=BY_DEVICE,
                         estimate_s={"cpu fp32": 0.1, "cuda fp32": 0.01})
    outpaced = result.series["cpu fp32"].outpaced
    assert outpaced is not None and outpaced.far_behind and steps["cpu fp32"].steps == 1


def test_equal_candidates_run_to_the_budget_without_a_verdict() -> None:
    result, _ = run_interleaved({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)},
                     settings=MeasureSettings(budget_s=2.0, round_min_s=0.0))
    assert all(s.dropped is None for s in result.series.values())
    assert result.rounds in _stats.LOOKS and result.rounds > _stats.LOOKS[0]
    assert result.elapsed_s >= 2.0


def test_a_tie_settled_tightly_stops_before_the_budget() -> None:
    result, _ = run_interleaved({"fp32": jittered(0.1, 0.001), "bf16": jittered(0.1, 0.001, phase=3)})
    assert result.rounds < SETTINGS.max_rounds
    assert result.elapsed_s < SETTINGS.budget_s


def test_a_near_tie_that_speed_decides_stops_once_either_pick_is_within_1pct() -> None:
    # channels_last and contiguous 0.8% apart: the faster estimate is picked, and once the slower cannot be
    # more than 1% faster, more rounds cannot change the pick by more than that (before, they went on until
    # the interval cleared 1: 22 rounds here, far more at a real machine's noise).
    settings = MeasureSettings(budget_s=20.0, round_min_s=0.0)
    by_speed, _ = run_interleaved({"contiguous": jittered(0.1008, 0.01), "channels_last": jittered(0.1, 0.01, phase=3)},
                       settings=settings, comparisons=Comparisons(group=lambda key: "cpu", margin=lambda a, b: 0.0))
    assert by_speed.rounds <= 10 and all(s.dropped is None for s in by_speed.series.values())


def test_timing_stops_only_at_looks() -> None:
    for budget_s in (0.5, 0.9, 1.3, 2.2):
        result, _ = run_interleaved({"a": jittered(0.1, 0.05), "b": jittered(0.1, 0.05, phase=2)},
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
    result, steps = run_interleaved({"fp32": jittered(0.1), "bf16": jittered(0.05)})
    assert steps["bf16"].selections == result.rounds  # one selection per round, not per step


def test_a_drifting_control_doubles_the_budget_and_flags_the_result() -> None:
    settings = MeasureSettings(budget_s=1.0, round_min_s=0.0)
    steady, _ = run_interleaved({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, settings=settings)
    drifting = (0.001 * (1 + 0.05 * i) for i in itertools.count())
    noisy, _ = run_interleaved({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, control=drifting,
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
    result, _ = run_interleaved({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)}, settings=settings,
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
    result, _ = run_interleaved({"fp32": jittered(0.1), "bf16": jittered(0.05)}, control=jittered(0.001, 0.02))
    assert not result.noisy


def test_across_devices_the_slower_device_is_outpaced_not_dropped() -> None:
    by_device = BY_DEVICE
    result, steps = run_interleaved({"cpu fp32": jittered(0.2), "cuda fp32": jittered(0.1, 0.05),
                          "cuda bf16": jittered(0.099, 0.05, phase=3)}, comparisons=by_device)
    cpu = result.series["cpu fp32"]
    assert cpu.dropped is None and cpu.outpaced is not None and cpu.outpaced.low > 1.03
    assert steps["cpu fp32"].steps < steps["cuda fp32"].steps  # settled once outpaced


def test_past_the_budget_the_final_comparison_times_only_what_can_still_change_the_pick() -> None:
    # The CPU's tie against cuda (10% faster) is timed on; xpu's own pair is open too, but xpu's pick is resolved
    # against the CPU's within the budget: whichever xpu candidate it is, the pick does not change.
    result, steps = run_interleaved({"cpu a": jittered(0.1, 0.05), "cuda a": jittered(0.09, 0.05, phase=1),
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
    noisy, _ = run_interleaved({"cpu fp32": (0.2 * f for f in wrecked), "cuda bf16": jittered(0.1, 0.05)},
                    settings=settings, comparisons=BY_DEVICE)
    assert noisy.unresolved_gap and all(s.outpaced is None for s in noisy.series.values())
    clean, _ = run_interleaved({"cpu fp32": jittered(0.2, 0.05), "cuda bf16": jittered(0.1, 0.05)}, settings=settings,
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
