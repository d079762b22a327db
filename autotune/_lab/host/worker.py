"""The calibration worker, seen from the host: one process for a whole calibration, started early.

Never ``fork``: a child forked after the host ran ``backward()`` or initialised CUDA fails or deadlocks
(PyTorch wiki, "Autograd and Fork"; "Cannot re-initialize CUDA in forked subprocess"), and
``multiprocessing``'s spawn would re-import the app's ``__main__``. The worker
is ``python -m autotune._lab.entry``; the host sends it one :class:`Job` line per family and reads
protocol events back. Results stream per candidate, so a native crash (SIGABRT from an MPS assertion, a
segfault), a hang or an OOM loses only the candidate in flight: it is recorded with its class and a fresh
worker measures the rest of that family and the families after it. The host kills the worker's process
group on any exception (``KeyboardInterrupt`` included) before the calibration lock is released. The OS
process itself is ``process``'s business, what the worker measures ``session``'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time
from types import TracebackType

from autotune._apply import fp32 as _fp32
from autotune._errors import CalibrationCancelled, CalibrationError, TraceError, WorkerStartError
from autotune._families import Family
from autotune._lab import load
from autotune._lab.check import check
from autotune._lab.child import Control, calibrate
from autotune._lab.host.launch import worker_argv
from autotune._lab.host.process import Attempt, Event, Process, Progress, record, start_advice
from autotune._lab.max_batch import probe_memory
from autotune._lab.plan import BASELINE
from autotune._lab.prepare import unverified, warm_process
from autotune._lab.protocol import (
    CalibrationSettings,
    Checked,
    CheckJob,
    Checkpoint,
    Done,
    Failed,
    Job,
    MemoryProbed,
    MemoryProbeJob,
    Planned,
    Traced,
    TraceJob,
)
from autotune._lab.trace import traced_or_failure
from autotune._records import Candidate, CandidateResult, Failure, FamilyResult
from autotune._reports import TraceReport
from autotune._version import __version__

log = logging.getLogger("autotune")

class Worker:
    """The worker of one calibration: ``start()`` it early, ``run_family`` for each family, then close."""

    def __init__(self, *, isolation: str, timeout_s: float) -> None:
        self.isolation = isolation
        self.timeout_s = timeout_s
        self._process: Process | None = None
        self._warm = False
        #: worker processes started so far: 1 for a calibration without crashes
        self.starts = 0
        self._cancelled = threading.Event()
        self._guard = threading.Lock()  # start() and cancel() from different threads

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and self._process is not None:
            self._process.kill()
            self._process = None
        self.close()

    def cancel(self) -> None:
        """From any thread: kill the worker's process group now; the family in progress raises
        :class:`CalibrationCancelled` and no worker starts again. In-process isolation stops between families."""
        with self._guard:
            self._cancelled.set()
            process = self._process
        if process is not None:
            process.kill()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def start(self) -> None:
        """Start the worker process now, so its interpreter start overlaps the host's own work; raises
        :class:`WorkerStartError` when no process can be started."""
        with self._guard:
            self._start()

    def _start(self) -> None:
        if self._cancelled.is_set():
            raise CalibrationCancelled()
        if self.isolation == "inprocess" or self._process is not None:
            return
        argv = worker_argv()
        try:
            process = Process.spawn(argv)
        except OSError as exc:
            raise WorkerStartError(f"no process could be started ({exc})", argv, advice=start_advice(argv)) from exc
        self._process = process
        self.starts += 1

    @property
    def pid(self) -> int | None:
        """The running worker process's id (its process group's too), if one runs."""
        return self._process.proc.pid if self._process is not None else None

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None

    def run_family(
        self, family: Family, settings: CalibrationSettings, progress: Progress | None = None, *,
        processes: int = 1, threads: int | None = None,
    ) -> FamilyResult:
        """Calibrate ``family``, restarting the worker after each crash, until every candidate has an answer.

        ``processes``: of one job, sharing this machine (each CPU candidate is timed with that many running its
        step); ``threads``: what a candidate without a count of its own runs with (default: torch's default for
        this environment, whatever this process set, see ``Job.threads``)."""
        started = time.perf_counter()
        planned: list[Candidate] | None = None
        backend_notes: dict[str, str] = {}
        failed: dict[Candidate, CandidateResult] = {}
        checkpoint: Checkpoint | None = None
        done: Done | None = None
        start_s = 0.0
        while done is None:
            reference = failed.get(BASELINE)
            if planned and reference is not None and reference.failure is not None:
                for candidate in planned:
                    failed.setdefault(candidate, CandidateResult(candidate=candidate,
                                                                 failure=unverified(reference.failure)))
                break
            attempt = Attempt()
            answered, resumed_from = len(failed), checkpoint
            # A restarted worker goes on from the last stage finished, without the candidates that failed.
            job = Job(family=family, failed=list(failed.values()),
                      resume=checkpoint, settings=settings, fp32=_fp32.current(),
                      threads=threads, processes=processes,
                      sys_path=[p for p in sys.path if p])
            start_s += self._attempt(job, attempt, progress, since=started)
            for event in attempt.events:
                if isinstance(event, Planned):  # the first plan, then the variants each later stage adds
                    planned = [*(planned or []), *(c for c in event.candidates if c not in (planned or []))]
                    backend_notes.update(event.backend_notes)
                elif isinstance(event, Failed):
                    failed[event.result.candidate] = event.result
                elif isinstance(event, Checkpoint):
                    checkpoint = event
                elif isinstance(event, Done):
                    done = event
            if done is None and self._cancelled.is_set():  # killed on purpose: no candidate to blame
                raise CalibrationCancelled(family.name)
            if done is None:
                if planned is None:
                    why = attempt.ended.detail if attempt.ended else "no answer"
                    raise CalibrationError(family.name, [("worker", why)])
                if attempt.in_flight is not None and attempt.in_flight not in failed:
                    ended = attempt.ended or Failure(kind="crashed", detail="the worker stopped without a result")
                    failed[attempt.in_flight] = CandidateResult(candidate=attempt.in_flight, failure=ended)
                    log.warning("%s %s: %s (%s); restarting the worker to search on without it",
                                family.name, attempt.in_flight.label, ended.kind, ended.detail)
                elif len(failed) == answered and checkpoint is resumed_from:
                    # Died between candidates, with no stage finished since: restarting would loop forever.
                    why = attempt.ended.detail if attempt.ended else "the worker stopped without a result"
                    raise CalibrationError(family.name, [("worker", why)])
                elif len(failed) == answered:
                    assert checkpoint is not None
                    log.warning("%s: the worker stopped between candidates after stage %d (%s); restarting it "
                                "from there", family.name, checkpoint.stage,
                                attempt.ended.detail if attempt.ended else "no detail")
        measured = {r.candidate: r for r in (done.results if done is not None else [])}
        return FamilyResult(
            model_kind=family.name,
            measured_at=dt.datetime.now(dt.timezone.utc).isoformat(),
            autotune_version=__version__,
            wall_s=time.perf_counter() - started,
            worker_start_s=start_s,
            budget_s=settings.measure.budget_s,
            candidates=[measured.get(c) or failed[c] for c in (planned or []) if c in measured or c in failed],
            control_ms=done.control_ms if done is not None else [],
            noisy=done.noisy if done is not None else False,
            noisy_because=done.noisy_because if done is not None else [],
            loads=done.loads if done is not None else [],
            control_shift=done.control_shift if done is not None else None,
            host_wait_s=done.host_wait_s if done is not None else 0.0,
            backend_notes=backend_notes,
            search_notes=done.search_notes if done is not None else [],
        )

    def run_trace(self, job: TraceJob) -> TraceReport:
        """Trace one candidate in the worker; raises TraceError when it crashes, hangs or fails."""
        if self.isolation == "inprocess":
            with _fp32.preserved():
                outcome = traced_or_failure(job)
            if isinstance(outcome, TraceReport):
                return outcome
            raise TraceError(job.family.name, job.candidate.label, outcome.kind, outcome.detail)
        attempt = Attempt()
        self._send(job, attempt, None, until=(Traced, Failed))
        for event in attempt.events:
            if isinstance(event, Traced):
                return event.report
        failed = next((e.result.failure for e in attempt.events if isinstance(e, Failed)), None)
        failure = failed or attempt.ended or Failure(kind="crashed", detail="the worker stopped without a result")
        raise TraceError(job.family.name, job.candidate.label, failure.kind, failure.detail)

    def run_check(self, job: CheckJob) -> tuple[Checked | None, list[CandidateResult], Failure | None]:
        """Re-time the job's candidates: (their rounds or None, the candidates that failed, how the worker ended)."""
        attempt = Attempt()
        if self.isolation == "inprocess":
            with _fp32.preserved():
                check(job, lambda event: record(event, attempt, None), clock=time.perf_counter, control=Control(),
                      settle=load.settle, watch=load.Watch(host=None))
        else:
            self._send(job, attempt, None, until=(Checked,))
        checked = next((e for e in attempt.events if isinstance(e, Checked)), None)
        failed = [e.result for e in attempt.events if isinstance(e, Failed)]
        if checked is None and attempt.in_flight is not None and attempt.ended is not None:
            failed.append(CandidateResult(candidate=attempt.in_flight, failure=attempt.ended))  # took the worker down
        return checked, failed, attempt.ended

    def run_memory_probe(self, job: MemoryProbeJob) -> MemoryProbed:
        """One memory probe in the worker; a worker that died in it (the kernel's OOM killer: SIGKILL) is the
        probe's failure, and the next probe starts a fresh worker."""
        if self.isolation == "inprocess":
            with _fp32.preserved():
                return probe_memory(job)
        attempt = Attempt()
        self._send(job, attempt, None, until=(MemoryProbed,))
        probed = next((e for e in attempt.events if isinstance(e, MemoryProbed)), None)
        if probed is not None:
            return probed
        failure = attempt.ended or Failure(kind="crashed", detail="the worker stopped")
        return MemoryProbed(batch_size=job.batch_size, peak_bytes=None, peak_reserved_bytes=None, free_bytes=None,
                            failure=failure)

    def _send(self, job: Job | TraceJob | CheckJob | MemoryProbeJob, attempt: Attempt, progress: Progress | None, *,
              until: tuple[type[Event], ...]) -> Process:
        """Run ``job`` in the worker (started if needed) up to one of ``until``; the process it ran in. A worker
        that died is forgotten (the next job starts a fresh one); one started early that died before it said a word
        about its first job is replaced at once, as it would have been had it died before it was taken (the job is
        not to blame: the fresh worker's death would be). One that never got ready raises
        :class:`WorkerStartError`, unless it was cancelled. On any exception, ``KeyboardInterrupt`` and an app's
        cancel included, it is killed before the wait unwinds."""
        self.start()
        process = self._process
        assert process is not None  # start() started one, or raised
        first_of_early = process.early and process.jobs == 0
        try:
            alive = process.run(job, attempt, self.timeout_s, progress, until=until)
        except WorkerStartError as exc:
            self._process = None
            if self._cancelled.is_set():  # killed on purpose while it started: the caller sees no events
                return process
            if not first_of_early:
                raise
            log.info("the worker started early did not start (%s); starting another", exc.why)
            return self._send(job, attempt, progress, until=until)
        except BaseException:
            process.kill()
            self._process = None
            raise
        if not alive:
            self._process = None
            if first_of_early and not attempt.events and not self._cancelled.is_set():
                log.info("the worker started early stopped before its first job (%s); starting another",
                         attempt.ended.detail if attempt.ended else "no detail")
                attempt.ended = None
                return self._send(job, attempt, progress, until=until)
        return process

    def _attempt(self, job: Job, attempt: Attempt, progress: Progress | None, *, since: float) -> float:
        """Run ``job`` once; returns how long this family waited for a worker to start."""
        if self.isolation == "inprocess":
            waited = 0.0
            if not self._warm:
                warm_started = time.perf_counter()
                warm_process()
                self._warm = True
                waited = time.perf_counter() - warm_started
            with _fp32.preserved():  # candidates switch the host's own settings: put them back
                calibrate(job, lambda event: record(event, attempt, progress), watch=load.Watch(host=None),
                          discard_on_device_error=False)
            return waited
        process = self._send(job, attempt, progress, until=(Done,))
        ready_at = process.ready_at if process.ready_at is not None else time.perf_counter()
        return max(0.0, ready_at - max(process.launched, since))


__all__ = ["Worker"]
