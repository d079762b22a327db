"""The worker process seen from the host: spawn it, send it a request, read its events, kill it.

How a process tree is started and killed is the platform's business, one small module each, chosen once
in ``launch`` (which may have started the worker before the host imported torch): ``_posix`` (a new
session, ``killpg``), ``_windows`` (a job object, ``TerminateJobObject``);
either way a timeout kills the worker and anything it started. Events arrive on a reader thread; the host
waits with a timeout since the last event, so a hung candidate is killed and recorded as ``timeout``; a
worker that dies is classified from its exit status and the tail of its stderr (signal, OOM, exit status).
A worker that never gets ready (it cannot start, says something other than autotune's hello, or stays silent)
is no candidate's failure: :class:`~autotune.WorkerStartError` says what ran and what to do.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from autotune._errors import WorkerStartError
from autotune._lab import entry
from autotune._lab.host.launch import Launched, take
from autotune._lab.protocol import (
    EVENT,
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
from autotune._records import Candidate, Failure

log = logging.getLogger("autotune")

Progress = Callable[[Candidate | None, float], None]
Event = Planned | Begin | Failed | Checkpoint | Done | Traced | Checked | MemoryProbed

#: the worker says hello before it imports anything heavy: an interpreter's start (a frozen app's included)
HELLO_TIMEOUT_S = 30.0
#: then it imports torch and warms up before it is ready; allow a slow disk that long whatever the candidate timeout
STARTUP_TIMEOUT_S = 120.0


@dataclass
class Attempt:
    """One job in one worker process: its events, how it ended, and the candidate it was busy with."""

    events: list[Event] = field(default_factory=list)
    in_flight: Candidate | None = None
    ended: Failure | None = None


class Process:
    """A running worker process: its protocol lines, its stderr tail, when it started and was ready."""

    def __init__(self, launched: Launched, *, early: bool = False) -> None:
        self.argv = launched.argv
        self.tree = launched.tree
        self.proc = launched.tree.proc
        self.lines = launched.lines
        self.stderr_tail = launched.stderr_tail
        self.launched = launched.launched
        self.said_hello = False
        self.ready_at: float | None = None
        self.threads = launched.readers
        #: started by ``launch`` before anyone asked for it
        self.early = early
        #: jobs sent so far
        self.jobs = 0

    @classmethod
    def spawn(cls, argv: list[str]) -> Process:
        """Start ``argv`` as a process tree of its own (or take the one ``launch`` started early for it);
        raises OSError when it cannot start."""
        early = take(argv)
        return cls(early, early=True) if early is not None else cls(Launched(argv))

    def run(self, job: Job | TraceJob | CheckJob | MemoryProbeJob, attempt: Attempt, timeout_s: float,
            progress: Progress | None, until: tuple[type[Event], ...] = (Done,)) -> bool:
        """Send ``job`` and record its events up to one of ``until``; True when the worker is still alive."""
        self.jobs += 1
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(job.model_dump_json() + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # the worker died; its exit status says why
        last_event = time.monotonic()
        while True:
            if self.ready_at is not None:
                limit = timeout_s
            else:
                limit = max(timeout_s, STARTUP_TIMEOUT_S) if self.said_hello else HELLO_TIMEOUT_S
            try:
                line = self.lines.get(timeout=max(0.0, limit - (time.monotonic() - last_event)))
            except queue.Empty:
                silent = time.monotonic() - last_event
                if self.ready_at is None:
                    raise self._unstarted(f"it said nothing for {silent:.0f} s" if not self.said_hello else
                                          f"it was not ready {silent:.0f} s after it started") from None
                self.kill()
                what = attempt.in_flight.label if attempt.in_flight else "the worker"
                attempt.ended = Failure(kind="timeout", detail=f"{what} made no progress for {silent:.0f} s; killed")
                break
            if line is None:
                if self.ready_at is None:
                    raise self._unstarted("it stopped before it was ready", ended=True)
                break
            last_event = time.monotonic()
            if not self.said_hello:
                self._hello(line.strip())
                continue
            try:
                event = EVENT.validate_json(line)
            except ValidationError:
                log.debug("worker wrote a non-protocol line: %r", line[:200])
                continue
            if isinstance(event, Ready):
                self.ready_at = time.perf_counter()
                continue
            record(event, attempt, progress)
            if isinstance(event, until):
                return True
        returncode = self.proc.wait()
        for thread in self.threads:
            thread.join(timeout=5)
        for tail in self.stderr_tail:
            log.debug("worker: %s", tail.rstrip())
        if attempt.ended is None and returncode != 0:  # used only if a candidate was in flight
            attempt.ended = _crash_failure(returncode, list(self.stderr_tail))
        return False

    def _hello(self, said: str) -> None:
        """The worker's first line must be :data:`entry.HELLO`: anything else means the command started something
        other than this installation's worker (a frozen app's own main, another autotune, a chatty interpreter)."""
        if said == entry.HELLO:
            self.said_hello = True
            return
        if said.startswith("autotune-worker "):
            raise self._unstarted(f"it runs autotune {said.removeprefix('autotune-worker ')}, this process "
                                  f"{entry.HELLO.removeprefix('autotune-worker ')}")
        raise self._unstarted(f"it wrote {said[:200]!r} where autotune's worker says {entry.HELLO!r} first")

    def _unstarted(self, why: str, *, ended: bool = False) -> WorkerStartError:
        """The error for a worker that never became ready, once it is gone: its exit status (None when it was
        still running and killed) and the last lines of its stderr. One whose output ``ended`` is exiting: it gets
        a few seconds to say its status."""
        status = self.proc.poll()
        if status is None and ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = self.proc.wait(timeout=5)
        if status is None:
            self.tree.kill()
        self.proc.wait()
        for thread in self.threads:
            thread.join(timeout=5)
        return WorkerStartError(why, self.argv, status=status, stderr=list(self.stderr_tail),
                                advice=start_advice(self.argv))

    def kill(self) -> None:
        """Kill the worker and anything it started, and reap it."""
        self.tree.kill()
        self.proc.wait()

    def close(self) -> None:
        """No more jobs: the worker exits by itself when its stdin closes; killed if it does not."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()


def start_advice(argv: list[str]) -> str:
    """What to do about a worker started with ``argv`` that did not start."""
    if argv[1:2] == [entry.WORKER_FLAG]:
        return ("This app runs frozen, and its executable runs the app's own code: call autotune.freeze_support() "
                "first in its entry point (a PyInstaller build with autotune installed needs no call), or name a "
                "Python that can import autotune and torch in AUTOTUNE_WORKER_PYTHON")
    return ("Check that this interpreter can import autotune and torch, or name one that can in "
            "AUTOTUNE_WORKER_PYTHON; where no process can be started, set AUTOTUNE_ISOLATION=inprocess")


def record(event: Event, attempt: Attempt, progress: Progress | None) -> None:
    attempt.events.append(event)
    if isinstance(event, Begin):
        attempt.in_flight = event.candidate
        if progress is not None:
            progress(event.candidate, event.fraction)
    elif isinstance(event, (Failed, Checkpoint, Done, MemoryProbed)):
        attempt.in_flight = None
        if isinstance(event, Done) and progress is not None:
            progress(None, 1.0)


def _last_words(stderr_tail: list[str]) -> str:
    """What a dead worker said last: for a native crash, faulthandler's innermost frame of the crashing thread
    (``File "model.py", line 12 in forward``) rather than its closing list of extension modules."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    for index, line in enumerate(lines):
        if "most recent call first" in line and index + 1 < len(lines) and lines[index + 1].startswith("File "):
            return lines[index + 1]
    return next((line for line in reversed(lines) if not line.startswith("Extension modules:")), "")


def _crash_failure(returncode: int, stderr_tail: list[str]) -> Failure:
    last = _last_words(stderr_tail)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        detail = f"{name}" + (f": {last[:200]}" if last else "")
        return Failure(kind="crashed", detail=detail)
    if "out of memory" in last.lower() or "MemoryError" in last:
        return Failure(kind="oom", detail=last[:300])
    detail = f"worker exited with status {returncode}" + (f": {last[:200]}" if last else "")
    return Failure(kind="crashed", detail=detail)


__all__ = ["HELLO_TIMEOUT_S", "STARTUP_TIMEOUT_S", "Event", "Process", "Progress", "record", "start_advice"]
