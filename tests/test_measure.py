"""The interleaved adaptive loop on a fake clock: deterministic, no wall time involved."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from autotune._decide import decide
from autotune._measure import MeasureSettings, interleave, warm_up
from autotune._models import Candidate
from samples import family


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStep:
    """Advances the fake clock by its next step time: a deterministic stand-in for a training step."""

    def __init__(self, clock: FakeClock, times_s: Iterator[float]) -> None:
        self.clock = clock
        self.times_s = times_s
        self.steps = 0

    def run(self) -> None:
        self.steps += 1
        self.clock.now += next(self.times_s)


def jittered(step_s: float, jitter: float = 0.02, phase: int = 0) -> Iterator[float]:
    pattern = [1.0, 1 + jitter, 1 - jitter, 1 + jitter / 2, 1 - jitter / 2, 1 + jitter / 3, 1 - jitter / 3]
    return (step_s * factor for factor in itertools.islice(itertools.cycle(pattern), phase, None))


SETTINGS = MeasureSettings(budget_s=5.0, round_min_s=0.0)


def _run(step_times: dict[str, Iterator[float]], control: Iterator[float] | None = None,
         settings: MeasureSettings = SETTINGS):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    steps = {name: FakeStep(clock, times) for name, times in step_times.items()}
    control_step = FakeStep(clock, control or itertools.repeat(0.001))
    result = interleave(steps, estimate_s={k: 0.01 for k in steps}, control=control_step, clock=clock,
                        settings=settings, settle=lambda s: None)
    return result, steps


def test_a_2x_winner_is_found_in_the_minimum_rounds() -> None:
    result, steps = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)})
    assert result.rounds == SETTINGS.min_rounds
    assert result.series["fp32"].dropped is not None and "clearly slower than bf16" in result.series["fp32"].dropped
    assert steps["fp32"].steps == SETTINGS.min_rounds


def test_a_100x_slower_candidate_costs_one_step() -> None:
    result, steps = _run({"fp32": jittered(0.1), "bf16": jittered(0.05), "fp16": jittered(10.0)},
                         settings=MeasureSettings(budget_s=30.0, round_min_s=0.0))
    assert steps["fp16"].steps == 1
    assert result.series["fp16"].dropped == "200.0x slower than bf16 after 1 round"
    assert steps["bf16"].steps == SETTINGS.min_rounds


def test_equal_candidates_run_to_the_budget_and_tie_to_fp32() -> None:
    result, _ = _run({"fp32": jittered(0.1, 0.05), "bf16": jittered(0.1, 0.05, phase=3)},
                     settings=MeasureSettings(budget_s=2.0, round_min_s=0.0))
    assert all(s.dropped is None for s in result.series.values())
    assert result.rounds > SETTINGS.min_rounds
    assert result.elapsed_s >= 2.0
    config = decide(_as_family(result), digest="d")
    assert config.precision == "fp32"
    assert "no measurable difference" in config.reason


def test_a_tie_settled_tightly_stops_before_the_budget() -> None:
    result, _ = _run({"fp32": jittered(0.1, 0.001), "bf16": jittered(0.1, 0.001)})
    assert result.rounds < SETTINGS.max_rounds
    assert result.elapsed_s < SETTINGS.budget_s


def test_a_drifting_control_extends_sampling_and_flags_the_result() -> None:
    drifting = (0.001 * (1 + 0.05 * i) for i in itertools.count())
    result, _ = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)}, control=drifting)
    assert result.noisy
    assert result.rounds == 2 * SETTINGS.min_rounds


def test_a_steady_control_is_not_noisy() -> None:
    result, _ = _run({"fp32": jittered(0.1), "bf16": jittered(0.05)}, control=jittered(0.001, 0.02))
    assert not result.noisy


def test_round_length_adapts_to_tiny_steps() -> None:
    clock = FakeClock()
    steps = {"tiny": FakeStep(clock, itertools.repeat(0.0005))}
    result = interleave(steps, estimate_s={"tiny": 0.0005}, control=FakeStep(clock, itertools.repeat(0.001)),
                        clock=clock, settings=MeasureSettings(budget_s=1.0, round_min_s=0.01), settle=lambda s: None)
    assert result.series["tiny"].steps_per_round == 20


def test_warm_up_runs_until_three_steps_agree() -> None:
    clock = FakeClock()
    settling = iter([0.5, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1])
    step = FakeStep(clock, settling)
    times = warm_up(step, clock, [], MeasureSettings())
    assert times[-3:] == [pytest.approx(0.1)] * 3
    assert step.steps == 6


def _as_family(result):  # type: ignore[no-untyped-def]
    from autotune import _stats
    from autotune._models import CandidateResult, Timing

    precision = {"fp32": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}
    return family("x", *[
        CandidateResult(
            candidate=Candidate(device="cpu", precision=precision[name]),  # type: ignore[arg-type]
            timing=Timing(round_ms=s.round_ms, steps_per_round=s.steps_per_round,
                          median_ms=_stats.median(s.round_ms), spread=_stats.spread(s.round_ms)),
        )
        for name, s in result.series.items()
    ])
