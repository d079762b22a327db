"""Calibration for the app: ``calibrate`` now, and, never blocking the app, ``start_calibration`` on a background
thread. Each report names every family's answer as ``best_config`` gives it (demotions honoured).

The job's thread drives the calibration's one worker process (``_lab.host.worker``); the app keeps
training meanwhile with ``best_config(kind, wait=False)``. ``cancel()`` kills the worker's process group at
once: the family in progress is not stored (its lock is released by the normal ``finally`` path), the ones
finished before stay stored, and the next job measures the rest. A job still running when the interpreter
exits is cancelled by an ``atexit`` hook; the worker also dies with its host by itself (``PR_SET_PDEATHSIG``
and a watchdog), so even a killed app leaves no worker behind.
"""

from __future__ import annotations

import atexit
import logging
import threading
import warnings
from collections.abc import Callable, Sequence

from autotune import _env
from autotune._answer import decided
from autotune._cache.documents import default_root
from autotune._calibrate import Calibrated, CalibrationProgress, in_background, run_calibration
from autotune._config import Config, config_of
from autotune._errors import CalibrationCancelled, CalibrationPending
from autotune._families import Family, builtin_family_names, get_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._lab.host.worker import Worker
from autotune._records import FamilyResult, Record

log = logging.getLogger("autotune")

Listener = Callable[[CalibrationProgress], None]


class CalibrationReport(Record):
    """What ``calibrate`` measured: the fingerprint, each family's measurements and auto-preference Config."""

    fingerprint: Fingerprint
    measurements: dict[str, FamilyResult]
    configs: dict[str, Config]
    wall_s: float
    store_path: str


def calibrate(
    model_kinds: Sequence[str] | None = None,
    *,
    force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None,
) -> CalibrationReport:
    """Measure each family (default: the built-ins) on this machine, for an app's first launch.

    Families already measured on this machine for the same key (build, ``version=``, search, budget) are reused
    unless ``force=True``, or unless they were measured while the machine was busy (``noisy``: measured again
    once, then kept) or under older rules (an upgrade changed the search, its margins or the verification): those
    are measured again (``best_config`` serves them meanwhile). A candidate that timed out, crashed or ran out of
    memory more than a day ago is tried again. ``progress`` receives a :class:`CalibrationProgress` as each
    candidate starts, for a progress bar. A failure of the fp32 CPU reference raises CalibrationError (after
    the other families) and is not stored. To calibrate without blocking, see :func:`autotune.start_calibration`.
    """
    if isinstance(model_kinds, str):
        raise TypeError(f"calibrate takes a list of model kinds: calibrate([{model_kinds!r}])")
    kinds = list(model_kinds) if model_kinds is not None else builtin_family_names()
    families = [get_family(kind) for kind in kinds]  # unknown names fail before anything is measured
    return report(run_calibration(families, force=force, progress=progress))


def report(calibrated: Calibrated) -> CalibrationReport:
    """``calibrated`` with each family's auto-preference answer, as ``best_config`` gives it: what training runs
    demoted on this machine is left out, ``AUTOTUNE_DEVICE`` forces its device."""
    forced, digest = _env.DEVICE.get(), calibrated.fingerprint.digest
    configs = {kind: config_of(decided(m, prefer="auto", expected_steps=None, forced_device=forced, digest=digest))
               for kind, m in calibrated.measurements.items()}
    return CalibrationReport(fingerprint=calibrated.fingerprint, measurements=calibrated.measurements,
                             configs=configs, wall_s=calibrated.wall_s, store_path=calibrated.store_path)


class CalibrationJob:
    """A calibration running on a background thread; see :func:`start_calibration`.

    ``progress`` callbacks run on the job's thread (named ``autotune-calibration``), never on the app's: a GUI
    hands the value to its own thread (e.g. a queue or ``call_soon_threadsafe``). A callback that raises is
    logged and otherwise ignored.
    """

    def __init__(self, families: list[Family], key: tuple[object, ...]) -> None:
        self._families = families
        self.kinds = [family.name for family in families]
        self._key = key
        self._listeners: list[Listener] = []
        self._guard = threading.Lock()
        self._finished = threading.Event()
        self._cancelled = False
        self._worker: Worker | None = None
        self._report: CalibrationReport | None = None
        self._error: BaseException | None = None
        self._progress: CalibrationProgress | None = None
        #: the AUTOTUNE_* settings at the start: the job measures for those, whatever the app sets meanwhile
        self._settings = _env.snapshot()
        self._thread = threading.Thread(target=self._run, name="autotune-calibration", daemon=True)

    @property
    def progress(self) -> CalibrationProgress | None:
        """The latest progress (None before the first candidate starts)."""
        return self._progress

    def done(self) -> bool:
        """True once the job finished, failed or was cancelled."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> CalibrationReport:
        """The report once the job is done; raises what the calibration raised, :class:`CalibrationCancelled`
        after ``cancel()``, or :class:`CalibrationPending` when ``timeout`` seconds pass first (the job goes on)."""
        if not self._finished.wait(timeout):
            raise CalibrationPending(self.kinds, timeout if timeout is not None else 0.0)
        if self._error is not None:
            raise self._error
        if self._report is None:  # set whenever no error is
            raise CalibrationCancelled(missing=self.kinds)
        return self._report

    def cancel(self) -> None:
        """Stop now: kill the worker, keep the families already finished, release every lock. Returns at once;
        ``wait()`` then raises :class:`CalibrationCancelled` naming what was and was not measured."""
        with self._guard:
            self._cancelled = True
            worker = self._worker
        if worker is not None:
            worker.cancel()

    def add_listener(self, listener: Listener | None) -> None:
        if listener is not None:
            with self._guard:
                self._listeners.append(listener)

    def _attach(self, worker: Worker) -> None:
        with self._guard:
            self._worker = worker
            cancelled = self._cancelled
        if cancelled:
            worker.cancel()

    def _on_progress(self, progress: CalibrationProgress) -> None:
        self._progress = progress
        with self._guard:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(progress)
            except Exception:  # an app's progress bar must not stop the calibration
                log.exception("a calibration progress callback raised; ignoring it")

    def _run(self) -> None:
        try:
            if self._cancelled:
                raise CalibrationCancelled(missing=self.kinds)
            with _env.pinned(self._settings):
                self._report = report(run_calibration(self._families, progress=self._on_progress,
                                                      on_worker=self._attach))
        except BaseException as exc:  # handed to wait(); the thread itself has nobody to tell
            self._error = exc
            if not isinstance(exc, CalibrationCancelled):
                log.warning("background calibration of %s failed: %s", ", ".join(self.kinds), exc)
        finally:
            with _jobs_guard:
                if _jobs.get(self._key) is self:
                    del _jobs[self._key]
            in_background(self.kinds, ended=True)
            self._finished.set()


_jobs: dict[tuple[object, ...], CalibrationJob] = {}
_jobs_guard = threading.Lock()


def start_calibration(
    model_kinds: Sequence[str] | None = None, *, progress: Listener | None = None, kinds: Sequence[str] | None = None
) -> CalibrationJob:
    """Start calibrating ``model_kinds`` (default: the built-ins) in the background and return at once.

    Families already measured are not measured again. While a job for the same kinds and settings runs, a
    second call joins it (its ``progress`` is added) instead of starting another; a job with another
    ``AUTOTUNE_DEVICE``, budget, search or defaults file is another job, and takes turns with the first, family
    by family (one measurement at a time per machine). ``progress`` runs on the job's thread. Meanwhile
    ``best_config(kind, wait=False)`` answers without blocking. Raises :class:`~autotune.ConfigurationError`
    for an invalid setting. ``kinds=`` is the older name of ``model_kinds`` (as :func:`~autotune.calibrate` names
    it), still accepted with a ``DeprecationWarning``.
    """
    if kinds is not None:
        if model_kinds is not None:
            raise TypeError("start_calibration got both model_kinds and kinds (its older name): pass model_kinds")
        warnings.warn("start_calibration(kinds=...) is now start_calibration(model_kinds=...), as calibrate names it",
                      DeprecationWarning, stacklevel=2)
        model_kinds = kinds
    if isinstance(model_kinds, str):
        raise TypeError(f"start_calibration takes a list of model kinds: start_calibration([{model_kinds!r}])")
    names = list(dict.fromkeys(model_kinds)) if model_kinds is not None else builtin_family_names()
    families = [get_family(name) for name in names]  # an unknown name fails here, in the app's thread
    key = (str(default_root()), fingerprint().digest, frozenset(names), _env.measured_for())
    with _jobs_guard:
        job = _jobs.get(key)
        started = job is None
        if job is None:
            job = _jobs[key] = CalibrationJob(families, key)
            in_background(job.kinds)  # from now until the job's thread ends: best_config(wait=False) says so
        job.add_listener(progress)
    if started:
        job._thread.start()
    return job


def cancel_all(*, timeout_s: float) -> None:
    """Cancel every job of this process and wait up to ``timeout_s`` for each to finish."""
    with _jobs_guard:
        jobs = list(_jobs.values())
    for job in jobs:
        job.cancel()
    for job in jobs:
        job._finished.wait(timeout=timeout_s)


@atexit.register
def _cancel_at_exit() -> None:
    cancel_all(timeout_s=5)


__all__ = ["CalibrationJob", "CalibrationReport", "calibrate", "cancel_all", "report", "start_calibration"]
