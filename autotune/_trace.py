"""Where a training step's time goes: one candidate's measured step under ``torch.profiler``, in a worker.

The field's playbook (PyTorch profiler recipe, Perfetto): warm-up steps stay out of the trace (first-call
allocation, kernel selection, ``torch.compile``), CPU and device activity are recorded together, and a few
steps are enough to see the pattern. The traced step is :class:`autotune._step.TrainStep`, the very step the
calibration timed. It runs in a fresh worker process (``python -m autotune._trace``) with the calibration
worker's protocol and crash handling, so a native crash in a candidate cannot take the caller down.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch.autograd.profiler_util import FunctionEventAvg

from autotune._errors import TraceError
from autotune._families import Family
from autotune._models import Candidate, Failure, Record

#: steps run before the profiler starts, and steps recorded
WARMUP_STEPS = 3
TRACED_STEPS = 5
#: operators in a report, most self time first
TOP_OPERATORS = 15
#: our own marker around each traced step, to find the steps in the timeline; not an operator
_STEP_MARKER = "autotune step"
_WORKER_MODULE = "autotune._trace"


class OperatorTime(Record):
    """One operator's share of a traced step, e.g. ``OperatorTime(name="aten::convolution_backward", ...)``.

    Times are per training step (totals over the traced steps divided by their count), in milliseconds.
    """

    name: str
    calls_per_step: float
    self_cpu_ms: float
    self_device_ms: float | None


class TraceReport(Record):
    """What ``trace`` found: the Chrome trace file and the operators that took the most self time.

    ``operators`` are sorted by self device time when the device's kernels were recorded (``device_activity``
    is ``"CUDA"`` or ``"XPU"``: their time is the step's), else by self CPU time; ``self_total_ms`` is the sum
    of that time over every operator, per step.
    """

    model_kind: str
    candidate: Candidate
    path: str
    warmup_steps: int
    steps: int
    step_ms: float = Field(description="mean wall time of a traced step, the profiler's overhead included")
    device_activity: str | None
    self_total_ms: float
    operators: list[OperatorTime]


class TraceJob(Record):
    """The host's request to the trace worker."""

    family_name: str
    family_ref: str
    candidate: Candidate
    init_scale: float | None
    path: str
    warmup_steps: int = WARMUP_STEPS
    steps: int = TRACED_STEPS
    top: int = TOP_OPERATORS
    sys_path: list[str]


def _device_activity(device_type: str) -> torch.profiler.ProfilerActivity | None:
    """The profiler activity that records this device's kernels; None where torch.profiler has none (MPS, CPU)."""
    activities = {"cuda": torch.profiler.ProfilerActivity.CUDA, "xpu": torch.profiler.ProfilerActivity.XPU}
    return activities.get(device_type)


def trace_candidate(job: TraceJob) -> TraceReport:
    """Build the candidate's step, warm it up, record ``job.steps`` steps, write the Chrome trace (worker side)."""
    from autotune._step import TrainStep
    from autotune.backends import backend_for

    backend = backend_for(job.candidate.device)
    step = TrainStep(Family(job.family_name, job.family_ref), job.candidate, backend, seed=0,
                     init_scale=job.init_scale)
    for _ in range(job.warmup_steps):
        step.run()
    device_activity = _device_activity(backend.device_type)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([device_activity] if device_activity else [])
    step_s: list[float] = []
    with torch.profiler.profile(activities=activities) as profile:
        for index in range(job.steps):
            started = time.perf_counter()
            with torch.profiler.record_function(f"{_STEP_MARKER} {index}"):
                step.run()
            step_s.append(time.perf_counter() - started)
    profile.export_chrome_trace(job.path)
    if not Path(job.path).is_file():  # the profiler logs "Failed to write to log file!" and carries on
        raise OSError(f"torch.profiler could not write the trace to {job.path}")
    by_device = device_activity is not None
    operators = [e for e in profile.key_averages() if not e.key.startswith(_STEP_MARKER)]
    operators.sort(key=lambda e: _self_us(e, by_device), reverse=True)
    per_step_ms = 1e-3 / job.steps
    return TraceReport(
        model_kind=job.family_name, candidate=job.candidate, path=job.path, warmup_steps=job.warmup_steps,
        steps=job.steps, step_ms=1000 * sum(step_s) / job.steps,
        device_activity=device_activity.name if device_activity else None,
        self_total_ms=per_step_ms * sum(_self_us(e, by_device) for e in operators),
        operators=[
            OperatorTime(
                name=e.key, calls_per_step=e.count / job.steps, self_cpu_ms=per_step_ms * e.self_cpu_time_total,
                self_device_ms=per_step_ms * e.self_device_time_total if by_device else None,
            )
            for e in operators[: job.top]
        ],
    )


def _self_us(event: FunctionEventAvg, by_device: bool) -> float:
    return float(event.self_device_time_total if by_device else event.self_cpu_time_total)


def run_trace(
    family: Family, candidate: Candidate, *, init_scale: float | None, path: Path, isolation: str, timeout_s: float,
) -> TraceReport:
    """Trace ``candidate`` of ``family`` into ``path``: in a fresh worker, or here with ``isolation="inprocess"``."""
    from autotune._worker import run_job

    job = TraceJob(family_name=family.name, family_ref=family.ref, candidate=candidate, init_scale=init_scale,
                   path=str(path), sys_path=[p for p in sys.path if p])
    if isolation == "inprocess":
        report_or_failure = _trace_or_failure(job)
        if isinstance(report_or_failure, TraceReport):
            return report_or_failure
        failure = report_or_failure
    else:
        events, ended = run_job(_WORKER_MODULE, job.model_dump(mode="json"), timeout_s=timeout_s)
        failure = ended or Failure(kind="crashed", detail="the worker stopped without a result")
        for event in events:
            if event["event"] == "done":
                return TraceReport.model_validate(event["report"])
            if event["event"] == "failed":
                failure = Failure.model_validate(event["failure"])
    raise TraceError(family.name, candidate.label, failure.kind, failure.detail)


def _trace_or_failure(job: TraceJob) -> TraceReport | Failure:
    from autotune._calibrate_family import classify
    from autotune.backends import backend_for

    try:
        return trace_candidate(job)
    except Exception as exc:  # noqa: BLE001 - the failure is reported with its class, as a candidate's would be
        return classify(exc, backend_for(job.candidate.device))


def _trace_job(raw: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> int:
    job = TraceJob.model_validate(raw)
    emit({"event": "begin", "candidate": job.candidate.model_dump(), "fraction": 0.0})
    outcome = _trace_or_failure(job)
    if isinstance(outcome, Failure):
        emit({"event": "failed", "candidate": job.candidate.model_dump(), "failure": outcome.model_dump()})
        return 1
    emit({"event": "done", "report": outcome.model_dump(mode="json")})
    return 0


if __name__ == "__main__":
    from autotune._worker import serve

    serve(_trace_job)


__all__ = ["TRACED_STEPS", "WARMUP_STEPS", "OperatorTime", "TraceReport", "run_trace", "trace_candidate"]
