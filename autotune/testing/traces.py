"""Recorded step times of a real machine, replayed on the fake clock of :mod:`autotune.testing.simulate`.

A :class:`TraceFile` holds one family's candidates and the control workload as ``benchmarks/record_traces.py``
timed them on one machine: interleaved rounds, each step's milliseconds and when each sample began. A
:class:`Replay` splits the candidates' steps in two: the machine's factor over time (the median of the steps near
that moment, each over its own candidate's median, so a burst that slowed them all shows there) and each
candidate's own factor step by step (its step over the machine's factor then: its own stalls and spread, in their
order). A replayed step at fake time ``t`` is its true mean time x the machine's factor at ``t`` x the candidate's
next own factor: a burst hits every candidate timed in it, as on the machine recorded, while each one keeps its own
tail. The assumption: a burst slows every candidate by the same factor. The control is replayed as it ran, by the
time of its runs: a pure-Python workload on one thread feels the machine its own way.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from autotune._records import Candidate
from autotune._variants import Facts


class TraceMachine(BaseModel):
    """Where and when a trace was recorded, e.g. ``cpu_brand="AMD EPYC 9R14", usable_cores=2``."""

    model_config = ConfigDict(frozen=True)

    cpu_brand: str
    usable_cores: int
    default_threads: int
    torch: str
    recorded_at: str
    #: the operating system's 1-, 5- and 15-minute load averages as the recording began and ended (None: no such
    #: figure on this system)
    load_average_start: tuple[float, float, float] | None
    load_average_end: tuple[float, float, float] | None


class StepTrace(BaseModel):
    """One workload's timed steps: ``steps_per_sample`` steps back to back per sample, each sample's start in
    seconds since the recording began, every step's milliseconds in order."""

    model_config = ConfigDict(frozen=True)

    steps_per_sample: int
    start_s: list[float]
    step_ms: list[float]

    def step_times(self) -> list[tuple[float, float]]:
        """(when it began, its ms) of every step."""
        found = []
        for index, start in enumerate(self.start_s):
            at = start
            for ms in self.step_ms[index * self.steps_per_sample:(index + 1) * self.steps_per_sample]:
                found.append((at, ms))
                at += ms / 1000
        return found


class CandidateTrace(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidate: Candidate
    steps: StepTrace


class TraceFile(BaseModel):
    """One family recorded on one machine: every candidate within ``far_behind`` of the fastest and the control,
    timed in the same interleaved rounds for ``seconds``; the slower ones' warm-up ms in ``left_out``."""

    model_config = ConfigDict(frozen=True)

    family: str
    machine: TraceMachine
    facts: Facts
    seconds: float
    far_behind: float
    candidates: list[CandidateTrace]
    left_out: list[tuple[Candidate, float]]
    control: StepTrace

    def write(self, path: Path) -> None:
        path.write_bytes(gzip.compress(self.model_dump_json().encode(), mtime=0))

    @classmethod
    def read(cls, path: Path) -> TraceFile:
        return cls.model_validate_json(gzip.decompress(path.read_bytes()))


#: the machine's factor is the median over at least this long and this many steps (of any candidate): what changes
#: faster than that (five heavy steps: seconds) cannot be told from a candidate's own and stays in its own factors
BIN_S = 0.05
BIN_STEPS = 5


@dataclass(frozen=True)
class Own:
    """A candidate's own factor step by step, and its steps' mean over their median (:class:`Cursor` divides by it,
    so its replayed steps average its true mean)."""

    factors: tuple[float, ...]
    mean_over_median: float


@dataclass(frozen=True)
class Replay:
    """A :class:`TraceFile` as the machine's factor over time, each candidate's own factors, and the control's
    runs over time (module docstring)."""

    bin_starts: tuple[float, ...]
    machine_factors: tuple[float, ...]
    duration_s: float
    own: Mapping[Candidate, Own]
    control_starts: tuple[float, ...]
    #: each control sample's runs over the control's median
    control_factors: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, trace: TraceFile) -> Replay:
        workloads = {one.candidate: one.steps.step_times() for one in trace.candidates}
        medians = {key: statistics.median(ms for _, ms in steps) for key, steps in workloads.items()}
        points = sorted((at, ms / medians[key], key.label, index) for key, steps in workloads.items()
                        for index, (at, ms) in enumerate(steps))
        starts: list[float] = []
        bins: list[list[float]] = []
        for at, relative, _, _ in points:
            if not bins or (at - starts[-1] >= BIN_S and len(bins[-1]) >= BIN_STEPS):
                starts.append(at)
                bins.append([])
            bins[-1].append(relative)
        factors = [statistics.median(one) for one in bins]
        own = {key.label: [0.0] * len(steps) for key, steps in workloads.items()}
        for at, relative, label, index in points:
            own[label][index] = relative / factors[bisect.bisect_right(starts, at) - 1]
        control = trace.control
        median = statistics.median(control.step_ms)
        runs = control.steps_per_sample
        return cls(
            tuple(starts), tuple(factors), points[-1][0],
            {key: Own(tuple(own[key.label]), statistics.fmean(ms for _, ms in steps) / medians[key])
             for key, steps in workloads.items()},
            tuple(control.start_s),
            tuple(tuple(ms / median for ms in control.step_ms[i * runs:(i + 1) * runs]) for i in range(len(
                control.start_s))),
        )

    def machine(self, at_s: float) -> float:
        """The machine's factor at ``at_s`` seconds into the recording (wrapped around its length)."""
        return self.machine_factors[_index(self.bin_starts, at_s % self.duration_s)]

    def control(self, at_s: float, run: int) -> float:
        """The control's ``run``-th run (of those its sample had, in turn) at ``at_s`` seconds into the recording
        over its median: the control's own weather, which need not be the candidates' (a pure-Python workload
        on one thread, descheduled when the cores are shared)."""
        runs = self.control_factors[_index(self.control_starts, at_s % self.duration_s)]
        return runs[run % len(runs)]

    def own_of(self, candidate: Candidate) -> Own | None:
        """``candidate``'s own factors: its own recording, else its plain candidate's; None when neither was
        timed (left out, far behind)."""
        return self.own.get(candidate, self.own.get(candidate.base))


def _index(starts: tuple[float, ...], at: float) -> int:
    return max(0, bisect.bisect_right(starts, at) - 1)


class Cursor:
    """One candidate's own factors in their recorded order from ``start``, wrapping around, over its mean over
    median."""

    def __init__(self, own: Own, start: int) -> None:
        self._factors = itertools.cycle(own.factors[start:] + own.factors[:start])
        self._scale = 1 / own.mean_over_median

    def next(self) -> float:
        return next(self._factors) * self._scale


def read_replay(path: Path) -> tuple[TraceFile, Replay]:
    """A trace file and its :class:`Replay`."""
    trace = TraceFile.read(path)
    return trace, Replay.of(trace)


__all__ = ["CandidateTrace", "Cursor", "Own", "Replay", "StepTrace", "TraceFile", "TraceMachine", "read_replay"]
