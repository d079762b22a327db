"""Record real step-time traces on this machine, for ``decision_sim.py`` to replay (``autotune.testing.traces``).

Per family, every candidate of the default search space (precisions x variants, as ``search_space`` lists them)
and the control workload, timed as a calibration times them: interleaved rounds in a fresh seeded order, each
candidate's sample at least ``round_min_s`` of steps (one untimed step first for cheap steps after the control's
pause), then the pause and three runs of the control. Candidates over ``far_behind`` x the fastest after warm-up
are left out (a calibration drops them after one round); their warm-up ms are kept. Each family is written to
``fixtures/traces/<family>.json.gz`` with the machine it ran on (CPU, cores, torch, date, load averages at start
and end). One JSON line per family.

    python benchmarks/record_traces.py [--seconds S] [--quick] [--out DIR] [FAMILY ...]

Record on a quiet machine: the traces are its weather (e.g. ``--seconds 300``, a few MB for the four built-ins).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

from _common import BUILTINS, emit, search_space, torch

from autotune._apply import axes
from autotune._apply import fp32 as _fp32
from autotune._families import get_family
from autotune._fingerprint import fingerprint
from autotune._lab.child import Control
from autotune._lab.load import settle
from autotune._lab.measure import MeasureSettings, timed, warm_up
from autotune._lab.step import TrainStep
from autotune.backends import backend_for
from autotune.testing.traces import CandidateTrace, StepTrace, TraceFile, TraceMachine

TRACES = Path(__file__).parent.parent / "fixtures" / "traces"
SLOW_S = 1.0


def _rounded(ms: float) -> float:
    return float(f"{ms:.4g}")


def _load_average() -> tuple[float, float, float] | None:
    if sys.platform == "win32":
        return None
    return os.getloadavg()


def _warm_s(runner: TrainStep, settings: MeasureSettings) -> float:
    """Seconds per step once warm (``warm_up``: until three steps agree), the last three's median; a step over
    ``SLOW_S`` once only (warming up 16 such candidates would take minutes)."""
    with runner.selected():
        first = timed(runner, time.perf_counter)
    if first > SLOW_S:
        return first
    return statistics.median(warm_up(runner, time.perf_counter, [first], settings)[-3:])


def record(kind: str, seconds: float, settings: MeasureSettings) -> TraceFile:
    """``kind``'s candidates and the control in interleaved rounds for ``seconds``."""
    load_start = _load_average()
    family = get_family(kind)
    fp32_host = _fp32.current()
    runners = {c: TrainStep(family, c, backend_for(c.device), seed=0, fp32_host=fp32_host) for c in search_space(kind)}
    warm = {c: _warm_s(runner, settings) for c, runner in runners.items()}
    # As a calibration's first round does: a candidate's time is the better of its warm-up and one more step.
    for candidate, runner in runners.items():
        with runner.selected():
            warm[candidate] = min(warm[candidate], timed(runner, time.perf_counter))
    fastest = min(warm.values())
    active = [c for c in runners if warm[c] <= settings.far_behind * fastest]
    per_sample = {c: max(1, math.ceil(settings.round_min_s / warm[c])) for c in active}
    starts: dict[object, list[float]] = {c: [] for c in active}
    steps: dict[object, list[float]] = {c: [] for c in active}
    control = Control()
    for _ in range(3):
        control.run()
    control_starts: list[float] = []
    control_steps: list[float] = []
    order = random.Random(0)
    paused = False
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        for candidate in order.sample(active, len(active)):
            runner = runners[candidate]
            with runner.selected():
                if paused and per_sample[candidate] > 1:
                    runner.run()
                starts[candidate].append(round(time.perf_counter() - began, 4))
                steps[candidate] += [_rounded(1000 * timed(runner, time.perf_counter))
                                     for _ in range(per_sample[candidate])]
            paused = False
        settle(settings.settle_s)
        control_starts.append(round(time.perf_counter() - began, 4))
        control_steps += [_rounded(1000 * timed(control, time.perf_counter)) for _ in range(3)]
        paused = True
    seen = fingerprint()
    machine = TraceMachine(cpu_brand=seen.cpu_brand, usable_cores=seen.usable_cores,
                           default_threads=torch.get_num_threads(), torch=torch.__version__,
                           recorded_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           load_average_start=load_start, load_average_end=_load_average())
    return TraceFile(
        family=kind, machine=machine, facts=axes.facts(family.build()), seconds=round(time.perf_counter() - began, 1),
        far_behind=settings.far_behind,
        candidates=[CandidateTrace(candidate=c, steps=StepTrace(steps_per_sample=per_sample[c], start_s=starts[c],
                                                                step_ms=steps[c])) for c in active],
        left_out=[(c, _rounded(1000 * warm[c])) for c in runners if c not in active],
        control=StepTrace(steps_per_sample=3, start_s=control_starts, step_ms=control_steps),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=180.0, help="per family")
    parser.add_argument("--quick", action="store_true", help="5 seconds per family: to check the script runs")
    parser.add_argument("--out", type=Path, default=TRACES)
    parser.add_argument("family", nargs="*")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in args.family or BUILTINS:
        trace = record(kind, 5.0 if args.quick else args.seconds, MeasureSettings())
        path = args.out / f"{kind}.json.gz"
        trace.write(path)
        emit({"benchmark": "record_traces", "family": kind, "path": str(path), "bytes": path.stat().st_size,
              "seconds": trace.seconds, "rounds": len(trace.control.start_s),
              "candidates": {one.candidate.label: round(statistics.median(one.steps.step_ms), 3)
                             for one in trace.candidates},
              "left_out": {c.label: ms for c, ms in trace.left_out},
              "load_average": [trace.machine.load_average_start, trace.machine.load_average_end]})


if __name__ == "__main__":
    main(sys.argv[1:])
