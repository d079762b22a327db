"""Recorded step-time traces replayed on the fake clock: the machine's weather apart from each candidate's own, a
pair shifted to a chosen true gap, the real search and decision code measuring it (no timing asserted)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune._decide import decide
from autotune._records import Candidate
from autotune._variants import Facts
from autotune.testing.simulate import simulate
from autotune.testing.traces import CandidateTrace, StepTrace, TraceFile, TraceMachine, read_replay
from autotune.testing.truth import truth_from_trace

TRACE = Path(__file__).parent.parent / "fixtures" / "traces" / "cnn.json.gz"
PLAIN = Candidate(device="cpu", precision="fp32")
CHANNELS_LAST = Candidate(device="cpu", precision="fp32", memory_format="channels_last")


def _recorded(step_ms: dict[Candidate | None, list[float]], steps_per_sample: int) -> TraceFile:
    """Workloads timed in turn, ``steps_per_sample`` steps each, as ``record_traces.py`` times them (None: the
    control)."""
    starts: dict[Candidate | None, list[float]] = {key: [] for key in step_ms}
    at = 0.0
    for sample in range(len(step_ms[None]) // steps_per_sample):
        for key, steps in step_ms.items():
            starts[key].append(at)
            at += sum(steps[sample * steps_per_sample:(sample + 1) * steps_per_sample]) / 1000
    machine = TraceMachine(cpu_brand="test", usable_cores=2, default_threads=2, torch="test", recorded_at="test",
                           load_average_start=None, load_average_end=None)
    return TraceFile(
        family="cnn", machine=machine, facts=Facts(image_inputs=True, default_optimizer=True), seconds=at,
        far_behind=4.0, left_out=[],
        candidates=[CandidateTrace(candidate=key, steps=StepTrace(steps_per_sample=steps_per_sample,
                                                                  start_s=starts[key], step_ms=step_ms[key]))
                    for key in step_ms if key is not None],
        control=StepTrace(steps_per_sample=steps_per_sample, start_s=starts[None], step_ms=step_ms[None]),
    )


def test_a_burst_is_the_machines_and_a_stall_the_candidates_own(tmp_path: Path) -> None:
    # Three workloads of 10-ms steps in turn, 5 steps a sample; samples 40-59 run 1.8x slower (a burst: all of
    # them), and one step of the plain candidate 6x (its own stall).
    count = 100 * 5
    burst = range(40 * 5, 60 * 5)
    steps: dict[Candidate | None, list[float]] = {
        key: [10.0 * (1.8 if i in burst else 1.0) for i in range(count)] for key in (PLAIN, CHANNELS_LAST, None)}
    steps[PLAIN][30 * 5 + 2] = 60.0
    path = tmp_path / "cnn.json.gz"
    _recorded(steps, 5).write(path)
    trace, replay = read_replay(path)
    assert trace.candidates[0].steps.step_ms == steps[PLAIN]
    sample_s = 3 * 5 * 0.010
    assert replay.machine(40 * sample_s + 10 * 1.8 * sample_s) == pytest.approx(1.8)  # inside the burst
    assert replay.machine(10 * sample_s) == pytest.approx(1.0)
    assert replay.machine(replay.duration_s + 10 * sample_s) == pytest.approx(1.0)  # wrapped around
    own = replay.own[PLAIN].factors
    assert own[30 * 5 + 2] == pytest.approx(6.0)
    assert max(own[:30 * 5 + 2] + own[30 * 5 + 3:]) < 2  # (a median over steps on a burst's edge: 1.8 at most)
    quiet = [factor for factor in replay.own[CHANNELS_LAST].factors if math.isclose(factor, 1.0)]
    assert len(quiet) >= 0.95 * count
    assert replay.control(40 * sample_s + 10 * 1.8 * sample_s, 4) == pytest.approx(1.8)  # the control's own
    assert replay.own_of(CHANNELS_LAST.model_copy(update={"num_threads": 1})) is replay.own[PLAIN]  # not recorded


@pytest.mark.parametrize("gap", [0.0, 0.045, 0.10], ids=["equal", "4.5pct", "10pct"])
def test_the_rival_is_shifted_to_the_gap_the_rest_as_recorded(gap: float) -> None:
    trace, replay = read_replay(TRACE)
    recorded = {one.candidate: sum(one.steps.step_ms) / len(one.steps.step_ms) for one in trace.candidates}
    truth = truth_from_trace(trace, replay, name="t", faster=(CHANNELS_LAST, PLAIN, gap))
    assert truth.step_ms(CHANNELS_LAST) == pytest.approx(truth.step_ms(PLAIN) / (1 + gap))
    assert truth.step_ms(PLAIN) == pytest.approx(recorded[PLAIN])


def test_a_pair_that_is_no_shift_of_one_setting_is_refused() -> None:
    trace, replay = read_replay(TRACE)
    fused = CHANNELS_LAST.model_copy(update={"optimizer": "fused"})
    with pytest.raises(ValueError, match="one setting more"):
        truth_from_trace(trace, replay, name="t", faster=(fused, PLAIN, 0.05))


def test_a_replay_is_seeded_and_a_25pct_layout_gain_is_found() -> None:
    trace, replay = read_replay(TRACE)
    truth = truth_from_trace(trace, replay, name="t", faster=(CHANNELS_LAST, PLAIN, 0.25))
    first, _ = simulate(truth, 3)
    again, _ = simulate(truth, 3)
    other, _ = simulate(truth, 4)
    assert first == again
    assert first != other  # another seed replays another stretch of the recording
    picks = [decide(simulate(truth, seed)[0], digest="sim") for seed in range(10)]
    assert all(pick.memory_format == "channels_last" for pick in picks)
