"""The calibration worker: a fresh Python process per family, started from our own entry point.

Never ``fork``: forking after the host ran ``backward()`` or touched CUDA errors or deadlocks
(BACKGROUND.md fact 8), and ``multiprocessing``'s spawn would re-import the app's ``__main__``. The host sends
one :class:`~autotune._calibration.protocol.Job` on stdin; the worker answers with protocol events on its
original stdout, while anything the model code prints is redirected to stderr so it cannot corrupt the
protocol. Results stream per candidate, so a native crash (SIGABRT from an MPS assertion, a segfault), a hang
or an OOM loses only the candidate in flight: it is recorded with its class and the worker is restarted for
the rest. This module handles processes only; what the worker measures is ``session``'s business.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from pydantic import ValidationError

from autotune._calibration.plan import BASELINE, plan
from autotune._calibration.protocol import (
    EVENT, Begin, CalibrationSettings, Done, Failed, FamilyRef, Job, Planned, Ready,
)
from autotune._calibration.session import Session
from autotune._calibration.setup import TorchLab, unverified, warm_process
from autotune._errors import CalibrationError
from autotune._families import Family
from autotune._models import Candidate, CandidateResult, Failure, FamilyResult
from autotune._version import __version__

log = logging.getLogger("autotune")

Progress = Callable[[Candidate | None, float], None]

#: the worker imports torch before its first word; allow a slow disk that long whatever the candidate timeout
STARTUP_TIMEOUT_S = 120.0
#: the worker's status after it reported a device error and stopped measuring (its candidate is already failed)
_EXIT_DEVICE_ERROR = 3


@dataclass
class _Attempt:
    """One worker process: its events, how it ended, and the candidate it was busy with."""

    events: list[Planned | Begin | Failed | Done] = field(default_factory=list)
    in_flight: Candidate | None = None
    ended: Failure | None = None
    start_s: float = 0.0


def run_family(
    family: Family, settings: CalibrationSettings, *, isolation: str, timeout_s: float,
    progress: Progress | None = None,
) -> FamilyResult:
    """Calibrate ``family`` in workers, restarting after each crash, until every candidate has an answer."""
    started = time.perf_counter()
    planned: list[Candidate] | None = None
    backend_notes: dict[str, str] = {}
    failed: dict[Candidate, CandidateResult] = {}
    done: Done | None = None
    attempts = 0
    worker_start_s = 0.0
    while done is None:
        remaining = None if planned is None else [c for c in planned if c not in failed]
        reference = failed.get(BASELINE)
        if remaining and reference is not None and reference.failure is not None:
            for candidate in remaining:
                failed[candidate] = CandidateResult(candidate=candidate, failure=unverified(reference.failure))
            break
        attempt = _Attempt()
        answered = len(failed)
        attempts += 1
        job = Job(family=FamilyRef(name=family.name, ref=family.ref), candidates=remaining, settings=settings,
                  sys_path=[p for p in sys.path if p])
        if isolation == "inprocess":
            warm_started = time.perf_counter()
            warm_process()
            attempt.start_s = time.perf_counter() - warm_started
            calibrate(job, lambda event: _record(event, attempt, progress), discard_on_device_error=False)
        else:
            _run_subprocess(job, attempt, timeout_s, progress)
        if attempts == 1:
            worker_start_s = attempt.start_s
        for event in attempt.events:
            if isinstance(event, Planned):  # the first plan, then the variants each later search stage adds
                planned = [*(planned or []), *(c for c in event.candidates if c not in (planned or []))]
                backend_notes.update(event.backend_notes)
            elif isinstance(event, Failed):
                failed[event.result.candidate] = event.result
            elif isinstance(event, Done):
                done = event
        if done is None:
            if planned is None:
                raise CalibrationError(family.name, [("worker", attempt.ended.detail if attempt.ended else "no answer")])
            if attempt.in_flight is not None and attempt.in_flight not in failed:
                ended = attempt.ended or Failure(kind="crashed", detail="the worker stopped without a result")
                failed[attempt.in_flight] = CandidateResult(candidate=attempt.in_flight, failure=ended)
                log.warning("%s %s: %s (%s); restarting the worker for the remaining candidates",
                            family.name, attempt.in_flight.label, ended.kind, ended.detail)
            elif len(failed) == answered:
                # Died between candidates: restarting would loop forever on the same point.
                why = attempt.ended.detail if attempt.ended else "the worker stopped without a result"
                raise CalibrationError(family.name, [("worker", why)])
    measured = {r.candidate: r for r in (done.results if done is not None else [])}
    return FamilyResult(
        model_kind=family.name,
        measured_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        autotune_version=__version__,
        wall_s=time.perf_counter() - started,
        worker_start_s=worker_start_s,
        budget_s=settings.measure.budget_s,
        candidates=[measured.get(c) or failed[c] for c in (planned or []) if c in measured or c in failed],
        control_ms=done.control_ms if done is not None else [],
        noisy=done.noisy if done is not None else False,
        backend_notes=backend_notes,
        search_notes=done.search_notes if done is not None else [],
    )


def calibrate(job: Job, emit: Callable[[Planned | Begin | Failed | Done], None], *,
              discard_on_device_error: bool = True) -> None:
    """Measure the job's family here (in the worker, or in the host when isolation is ``inprocess``)."""
    family = Family(job.family.name, job.family.ref)
    lab = TorchLab(family, job.settings)
    session = Session(lab, job.settings, emit, clock=time.perf_counter, control=_Control(), settle=time.sleep,
                      discard_on_device_error=discard_on_device_error)
    if job.candidates is None:
        candidates, notes = plan()
        session.run(candidates, staged=True, backend_notes=notes)
    else:
        session.run(job.candidates, staged=False, backend_notes={})


class _Control:
    """A fixed pure-Python workload: no candidate, thread setting or device can change its speed."""

    last = 0

    def run(self) -> None:
        total = 0
        for i in range(20_000):
            total += i * i
        self.last = total

    def selected(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _record(event: Planned | Begin | Failed | Done, attempt: _Attempt, progress: Progress | None) -> None:
    attempt.events.append(event)
    if isinstance(event, Begin):
        attempt.in_flight = event.candidate
        if progress is not None:
            progress(event.candidate, event.fraction)
    elif isinstance(event, (Failed, Done)):
        attempt.in_flight = None
        if isinstance(event, Done) and progress is not None:
            progress(None, 1.0)


def _run_subprocess(job: Job, attempt: _Attempt, timeout_s: float, progress: Progress | None) -> None:
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune._calibration.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # Its own process group, so a timeout kills the worker and anything it started.
            start_new_session=os.name == "posix",
            creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0),
        )
    except OSError as exc:
        attempt.ended = Failure(kind="crashed", detail=(
            f"cannot start a worker process ({exc}); hosts that cannot start processes can set "
            "AUTOTUNE_ISOLATION=inprocess"))
        return
    lines: queue.Queue[str | None] = queue.Queue()
    stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
    threads = [
        threading.Thread(target=_pump, args=(proc.stdout, lines.put, lambda: lines.put(None)), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, stderr_tail.append, lambda: None), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        if proc.stdin is not None:
            proc.stdin.write(job.model_dump_json() + "\n")
            proc.stdin.close()
    except OSError:
        pass  # the worker died at once; its exit status says why
    started = False
    launched = last_event = time.monotonic()
    while True:
        limit = timeout_s if started else max(timeout_s, STARTUP_TIMEOUT_S)
        try:
            line = lines.get(timeout=max(0.0, limit - (time.monotonic() - last_event)))
        except queue.Empty:
            silent = time.monotonic() - last_event
            _kill(proc)
            what = attempt.in_flight.label if attempt.in_flight else "the worker"
            attempt.ended = Failure(kind="timeout", detail=f"{what} made no progress for {silent:.0f} s; killed")
            break
        if line is None:
            break
        last_event = time.monotonic()
        try:
            event = EVENT.validate_json(line)
        except ValidationError:
            log.debug("worker wrote a non-protocol line: %r", line[:200])
            continue
        if isinstance(event, Ready):
            started = True
            attempt.start_s = last_event - launched
            continue
        _record(event, attempt, progress)
    returncode = proc.wait()
    for thread in threads:
        thread.join(timeout=5)
    for line in stderr_tail:
        log.debug("worker: %s", line.rstrip())
    if attempt.ended is None and returncode != 0:  # used only if a candidate was in flight
        attempt.ended = _crash_failure(returncode, list(stderr_tail))


def _pump(stream: TextIO | None, sink: Callable[[str], object], at_end: Callable[[], object]) -> None:
    if stream is not None:
        for line in stream:
            sink(line)
    at_end()


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _crash_failure(returncode: int, stderr_tail: list[str]) -> Failure:
    last = next((line.strip() for line in reversed(stderr_tail) if line.strip()), "")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        detail = f"{name}" + (f": {last[:200]}" if last else "")
        return Failure(kind="crashed", detail=detail)
    if "out of memory" in last.lower() or "MemoryError" in last:
        return Failure(kind="oom", detail=last[:300])
    return Failure(kind="crashed", detail=f"worker exited with status {returncode}" + (f": {last[:200]}" if last else ""))


def _worker_main() -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")  # line-buffered: each event is flushed
    os.dup2(2, 1)  # print() and C-level writes from model code go to stderr, not into the protocol
    sys.stdout = sys.stderr
    import faulthandler

    faulthandler.enable()  # a segfault or abort leaves a Python traceback in stderr, which the host keeps
    job = Job.model_validate_json(sys.stdin.readline())
    sys.path[:0] = [p for p in job.sys_path if p not in sys.path]
    finished: list[bool] = []

    def emit(event: Ready | Planned | Begin | Failed | Done) -> None:
        protocol.write(event.model_dump_json() + "\n")
        if isinstance(event, Done):
            finished.append(True)

    warm_process()
    emit(Ready())
    calibrate(job, emit)
    return 0 if finished else _EXIT_DEVICE_ERROR


if __name__ == "__main__":
    code = _worker_main()
    sys.stderr.flush()
    # Everything is reported; skip the interpreter's teardown (torch's takes ~0.5 s) that the host would wait for.
    os._exit(code)
