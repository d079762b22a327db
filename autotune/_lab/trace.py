"""Where a training step's time goes: one candidate's measured step under ``torch.profiler``, in the worker.

The field's playbook (PyTorch profiler recipe, Perfetto): warm-up steps stay out of the trace (first-call
allocation, kernel selection, ``torch.compile``), CPU and device activity are recorded together, and a few
steps are enough to see the pattern. The traced step is :class:`~autotune._lab.step.TrainStep`, the
very step the calibration timed, with the same settings applied outside it. It runs in the calibration
worker (a :class:`~autotune._lab.protocol.TraceJob`), so a native crash cannot take the caller down.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.autograd.profiler_util import FunctionEventAvg

from autotune._lab.prepare import classify
from autotune._lab.protocol import TraceJob
from autotune._lab.step import TrainStep
from autotune._records import Failure
from autotune._reports import OperatorTime, TraceReport
from autotune.backends import backend_for

#: our own marker around each traced step, to find the steps in the timeline; not an operator
_STEP_MARKER = "autotune step"


def trace_candidate(job: TraceJob) -> TraceReport:
    """Build the candidate's step, warm it up, record ``job.steps`` steps, write the Chrome trace."""
    backend = backend_for(job.candidate.device)
    step = TrainStep(job.family, job.candidate, backend, seed=0, fp32_host=job.fp32,
                     init_scale=job.init_scale)
    device_activity = backend.profiler_activity()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([device_activity] if device_activity else [])
    step_s: list[float] = []
    with step.selected():
        for _ in range(job.warmup_steps):
            step.run()
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
        model_kind=job.family.name, candidate=job.candidate, path=job.path, warmup_steps=job.warmup_steps,
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


def traced_or_failure(job: TraceJob) -> TraceReport | Failure:
    """The report, or the failure with its class, as a candidate's would be recorded."""
    try:
        return trace_candidate(job)
    except Exception as exc:
        return classify(exc, job.candidate.device)


def _self_us(event: FunctionEventAvg, by_device: bool) -> float:
    return float(event.self_device_time_total if by_device else event.self_cpu_time_total)


__all__ = ["trace_candidate", "traced_or_failure"]
