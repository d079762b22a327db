"""The interleaved loop on a fake clock, for its tests: a clock that moves only when a step runs, steps of known
times, and the comparisons' rules the loop is run with.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping

from autotune._lab.measure import (
    Comparisons,
    Interleaved,
    MeasureSettings,
    Series,
    Watch,
    interleave,
)


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


def run_interleaved(step_times: dict[str, Iterator[float]], control: Iterator[float] | None = None,
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
