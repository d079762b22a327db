"""The calibration worker process itself, run by ``entry`` once it is tied to its host's life.

It warms the process up, says :class:`Ready`, then measures one :class:`Job` per line of its stdin, in turn,
until the host closes stdin: one worker serves a whole calibration, and each family starts from
a clean slate (fresh model, optimizer, seeds, thread count). Events go out on the original stdout, one per
line; anything model code prints goes to stderr so it cannot corrupt the protocol.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import IO

import torch

from autotune._apply import fp32 as _fp32
from autotune._fingerprint import default_threads
from autotune._lab import load
from autotune._lab.check import check
from autotune._lab.copies import Load, LoadSetup
from autotune._lab.max_batch import pin_allocator, probe_memory
from autotune._lab.plan import plan
from autotune._lab.prepare import TorchLab, warm_process
from autotune._lab.protocol import (
    REQUEST,
    Begin,
    Checked,
    CheckJob,
    Checkpoint,
    Done,
    Failed,
    Job,
    MemoryProbed,
    MemoryProbeJob,
    Planned,
    Ready,
    Traced,
    TraceJob,
)
from autotune._lab.session import Session
from autotune._lab.trace import traced_or_failure
from autotune._records import CandidateResult, Failure

#: the worker's status after it reported a device error and stopped measuring (its candidate is already failed)
EXIT_DEVICE_ERROR = 3


class Control:
    """A fixed pure-Python workload: no candidate, thread setting or device can change its speed."""

    last = 0
    asynchronous = False

    def run(self, steps: int = 1) -> None:
        for _ in range(steps):
            total = 0
            for i in range(20_000):
                total += i * i
            self.last = total

    def selected(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def calibrate(job: Job, emit: Callable[[Planned | Begin | Failed | Checkpoint | Done], None], *, watch: load.Watch,
              discard_on_device_error: bool = True) -> bool:
    """Measure the job's family here (in the worker, or in the host when isolation is ``inprocess``), with
    ``watch`` the operating system's view of its timing.

    Returns False when a device error stopped it before the end (the worker must not go on).
    """
    finished: list[bool] = []

    def tracking(event: Planned | Begin | Failed | Checkpoint | Done) -> None:
        if isinstance(event, Done):
            finished.append(True)
        emit(event)

    threads = torch.get_num_threads()
    count = job.threads or default_threads()
    torch.set_num_threads(count)  # in-process, the host's own count: put back after
    try:
        with contextlib.ExitStack() as stack:
            copies = None
            if job.processes > 1:  # the job's other processes on this machine, as copies of each CPU step
                copies = stack.enter_context(Load(job.processes - 1, LoadSetup(
                    family=job.family, seed=job.settings.seed, fp32=job.fp32, threads=count,
                    sys_path=job.sys_path)))
            session = Session(TorchLab(job.family, job.settings, copies=copies), job.settings, tracking,
                              clock=time.perf_counter, control=Control(), settle=load.settle,
                              discard_on_device_error=discard_on_device_error,
                              watch=stack.enter_context(watch.counting(copies.pids if copies is not None else ())))
            candidates, notes = plan()
            session.run(candidates, staged=True, backend_notes=notes, failed=job.failed, resume=job.resume)
    finally:
        torch.set_num_threads(threads)
    return bool(finished)


def main(protocol: IO[str]) -> int:
    """Say :class:`Ready` on ``protocol`` (``entry`` keeps the original stdout for it), then measure each job on
    stdin until it closes; the worker's exit status."""
    import faulthandler

    faulthandler.enable()  # a segfault or abort leaves a Python traceback in stderr, which the host keeps

    def emit(event: Ready | Planned | Begin | Failed | Checkpoint | Done | Traced | Checked | MemoryProbed) -> None:
        protocol.write(event.model_dump_json() + "\n")

    default_threads()  # torch's own count for this environment, read before any job sets one
    warm_process()
    emit(Ready(pid=os.getpid()))
    watch = load.Watch(host=os.getppid())  # one per worker: it waits for its host's start-up once
    for line in sys.stdin:
        job = REQUEST.validate_json(line)
        sys.path[:0] = [p for p in job.sys_path if p not in sys.path]
        if isinstance(job, (Job, CheckJob, MemoryProbeJob)):  # a clean slate for each job, with the host's settings
            torch.set_num_threads(job.threads or default_threads())
        _fp32.ensure(job.fp32)
        if isinstance(job, TraceJob):
            trace(job, emit)
        elif isinstance(job, MemoryProbeJob):
            pin_allocator()
            emit(Begin(candidate=job.candidate, phase="setup", fraction=0.0))  # a crash now is this probe's
            emit(probe_memory(job))
        elif isinstance(job, CheckJob):
            check(job, emit, clock=time.perf_counter, control=Control(), settle=load.settle, watch=watch)
        elif not calibrate(job, emit, watch=watch):
            return EXIT_DEVICE_ERROR
    return 0


def trace(job: TraceJob, emit: Callable[[Begin | Failed | Traced], None]) -> None:
    """Trace the job's candidate; a failure is reported like a candidate's (the worker goes on)."""
    emit(Begin(candidate=job.candidate, phase="timing", fraction=0.0))
    outcome = traced_or_failure(job)
    if isinstance(outcome, Failure):
        emit(Failed(result=CandidateResult(candidate=job.candidate, failure=outcome)))
    else:
        emit(Traced(report=outcome))

