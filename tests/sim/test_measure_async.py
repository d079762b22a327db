"""Asynchronous steps in the interleaved loop on a fake clock: a step that only queues work is timed at a loop's
speed, in spans, each warm-up and cold first step left out the same way.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import pytest
from measure_for_tests import (
    ONE_DEVICE,
    FakeClock,
    FakeStep,
    jittered,
)

from autotune._lab.measure import (
    MeasureSettings,
    interleave,
    per_step_s,
    timed,
    warm_up,
)


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
