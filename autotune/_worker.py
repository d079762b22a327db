"""The calibration worker: a fresh Python process per family, started from our own entry point.

Never ``fork``: forking after the host ran ``backward()`` or touched CUDA errors or deadlocks
(BACKGROUND.md fact 8), and ``multiprocessing``'s spawn would re-import the app's ``__main__``. The host sends
one JSON job on stdin; the worker answers with JSON lines on its original stdout, while anything the model
code prints is redirected to stderr so it cannot corrupt the protocol. Results stream per candidate, so a
native crash (SIGABRT from an MPS assertion, a segfault), a hang or an OOM loses only the candidate in flight:
it is recorded with its class and the worker is restarted for the rest.
"""

from __future__ import annotations

import collections
import dataclasses
import json
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
from typing import Any, NoReturn, TextIO

from autotune._calibrate_family import BASELINE, Settings, calibrate_family, unverified, warm_process
from autotune._errors import CalibrationError
from autotune._families import Family
from autotune._measure import MeasureSettings
from autotune._models import Candidate, CandidateResult, Failure

log = logging.getLogger("autotune")

Progress = Callable[[Candidate | None, float], None]

#: the worker imports torch before its first word; allow a slow disk that long whatever the candidate timeout
STARTUP_TIMEOUT_S = 120.0
#: the worker's status after it reported a device error and stopped measuring (its candidate is already failed)
_EXIT_DEVICE_ERROR = 3


@dataclass
class FamilyOutcome:
    """Everything the worker(s) reported for one family."""

    results: list[CandidateResult]
    control_ms: list[float] = field(default_factory=list)
    noisy: bool = False
    backend_notes: dict[str, str] = field(default_factory=dict)
    search_notes: list[str] = field(default_factory=list)
    worker_starts: int = 0
    #: the first worker's start (interpreter, imports, process warm-up), a fixed cost of any calibration
    worker_start_s: float = 0.0


def _job(family: Family, candidates: list[Candidate] | None, settings: Settings) -> dict[str, Any]:
    return {
        "family": {"name": family.name, "ref": family.ref},
        "candidates": None if candidates is None else [c.model_dump() for c in candidates],
        "settings": dataclasses.asdict(settings),
        # Like multiprocessing's spawn: the worker must import what the host can (user families, tests).
        "sys_path": [p for p in sys.path if p],
    }


def _settings_from(raw: dict[str, Any]) -> Settings:
    return Settings(**{**raw, "measure": MeasureSettings(**raw["measure"])})


class _Attempt:
    """One worker process: its events, how it ended, and the candidate it was busy with."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.in_flight: Candidate | None = None
        self.ended: Failure | None = None
        self.start_s = 0.0


def run_family(
    family: Family, settings: Settings, *, isolation: str, timeout_s: float, progress: Progress | None = None
) -> FamilyOutcome:
    """Calibrate ``family`` in workers, restarting after each crash, until every candidate has an answer."""
    planned: list[Candidate] | None = None
    outcome = FamilyOutcome(results=[])
    failed: dict[Candidate, CandidateResult] = {}
    done: dict[str, Any] | None = None
    while done is None:
        remaining = None if planned is None else [c for c in planned if c not in failed]
        reference = failed.get(BASELINE)
        if remaining and reference is not None and reference.failure is not None:
            for candidate in remaining:
                failed[candidate] = CandidateResult(candidate=candidate, failure=unverified(reference.failure))
            break
        attempt = _Attempt()
        answered = len(failed)
        outcome.worker_starts += 1
        job = _job(family, remaining, settings)
        if isolation == "inprocess":
            started = time.perf_counter()
            warm_process()
            attempt.start_s = time.perf_counter() - started
            calibrate_family(family, remaining, settings, lambda e: _record(e, attempt, progress),
                             discard_on_device_error=False)
        else:
            _run_subprocess(job, attempt, timeout_s, progress)
        if outcome.worker_starts == 1:
            outcome.worker_start_s = attempt.start_s
        for event in attempt.events:
            kind = event["event"]
            if kind == "plan":  # the first plan, then the variants each later search stage adds
                added = [Candidate.model_validate(c) for c in event["candidates"]]
                planned = added if event["backend_notes"] is not None else [*(planned or []), *added]
                if event["backend_notes"] is not None:
                    outcome.backend_notes = event["backend_notes"]
            elif kind == "failed":
                candidate = Candidate.model_validate(event["candidate"])
                failed[candidate] = CandidateResult.model_validate(
                    {**event["extra"], "candidate": candidate, "failure": event["failure"]})
            elif kind == "done":
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
    measured = {r.candidate: r for r in (CandidateResult.model_validate(x) for x in (done or {}).get("results", []))}
    outcome.results = [measured.get(c) or failed[c] for c in (planned or []) if c in measured or c in failed]
    if done is not None:
        outcome.control_ms = done["control_ms"]
        outcome.noisy = done["noisy"]
        outcome.search_notes = done.get("search_notes", [])
    return outcome


def _record(event: dict[str, Any], attempt: _Attempt, progress: Progress | None) -> None:
    attempt.events.append(event)
    kind = event["event"]
    if kind == "begin":
        attempt.in_flight = Candidate.model_validate(event["candidate"])
        if progress is not None:
            progress(attempt.in_flight, event["fraction"])
    elif kind == "failed":
        attempt.in_flight = None
    elif kind == "done":
        attempt.in_flight = None
        if progress is not None:
            progress(None, 1.0)


def run_job(module: str, job: dict[str, Any], *, timeout_s: float) -> tuple[list[dict[str, Any]], Failure | None]:
    """Run one job in a fresh ``python -m module`` worker (a module that calls :func:`serve`).

    Returns the events it emitted, and how it ended when it stopped abnormally: killed after ``timeout_s`` of
    silence, crashed, or exited non-zero.
    """
    attempt = _Attempt()
    _run_subprocess(job, attempt, timeout_s, None, module=module)
    return attempt.events, attempt.ended


def _run_subprocess(
    job: dict[str, Any], attempt: _Attempt, timeout_s: float, progress: Progress | None, *, module: str = "autotune._worker"
) -> None:
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
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
            proc.stdin.write(json.dumps(job) + "\n")
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
            event = json.loads(line)
        except json.JSONDecodeError:
            log.debug("worker wrote a non-protocol line: %r", line[:200])
            continue
        if event.get("event") == "ready":
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


def _pump(stream: TextIO | None, sink: Callable[[str], None], at_end: Callable[[], None]) -> None:
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


Handler = Callable[[dict[str, Any], Callable[[dict[str, Any]], None]], int]


def serve(handle: Handler) -> NoReturn:
    """The worker's side of the protocol: read one JSON job from stdin, warm up, say ``ready``, then let
    ``handle(job, emit)`` emit JSON-line events and return the exit status."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")  # line-buffered: each event is flushed
    os.dup2(2, 1)  # print() and C-level writes from model code go to stderr, not into the protocol
    sys.stdout = sys.stderr
    import faulthandler

    faulthandler.enable()  # a segfault or abort leaves a Python traceback in stderr, which the host keeps
    job = json.loads(sys.stdin.readline())
    sys.path[:0] = [p for p in job["sys_path"] if p not in sys.path]

    def emit(event: dict[str, Any]) -> None:
        protocol.write(json.dumps(event) + "\n")

    warm_process()
    emit({"event": "ready"})
    code = handle(job, emit)
    sys.stderr.flush()
    # Everything is reported; skip the interpreter's teardown (torch's takes ~0.5 s) that the host would wait for.
    os._exit(code)


def _calibrate_job(job: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> int:
    family = Family(job["family"]["name"], job["family"]["ref"])
    candidates = None if job["candidates"] is None else [Candidate.model_validate(c) for c in job["candidates"]]
    events: list[str] = []

    def tracking_emit(event: dict[str, Any]) -> None:
        events.append(event["event"])
        emit(event)

    calibrate_family(family, candidates, _settings_from(job["settings"]), tracking_emit)
    return 0 if "done" in events else _EXIT_DEVICE_ERROR


if __name__ == "__main__":
    serve(_calibrate_job)
