"""A calibration, host side: each family through the one miss path (:func:`ensure_measured`: under its lock, in
one shared worker, stored as it finishes).

``run_calibration`` (the families of ``autotune.calibrate`` or of a background job, handing its worker to the job;
``_background`` adds each family's answer), ``running`` (what this process's background jobs calibrate, which
``best_config(wait=False)`` says), ``ensure_measured`` (``best_config``'s miss, and each family of a calibration),
``measure_family`` (one family now, no cache involved).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune import _env
from autotune._cache import lookup as _cached
from autotune._cache.freshness import family_key, freshness, now_utc, reference_failure, rules_digest
from autotune._cache.locks import acquire, held_elsewhere, measuring, measuring_lock
from autotune._cache.store import Store
from autotune._decide import picked
from autotune._errors import CalibrationCancelled, CalibrationError
from autotune._families import Family, get_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._lab.host.worker import Worker
from autotune._lab.measure import MeasureSettings
from autotune._lab.protocol import CalibrationSettings
from autotune._records import Candidate, FamilyKey, FamilyResult
from autotune._variants import threads_per_process
from autotune._wording import noise_words, remeasure_advice

log = logging.getLogger("autotune")


@dataclass(frozen=True)
class CalibrationProgress:
    """Handed to ``calibrate(progress=...)``: e.g. ``family='cnn', candidate='cpu bf16-mixed', fraction=0.4``.

    ``fraction`` is the share of the whole calibration done, from 0 to 1, never decreasing.
    """

    family: str
    candidate: str | None
    fraction: float


@dataclass(frozen=True)
class Calibrated:
    """What :func:`run_calibration` measured: the fingerprint, each family's measurements, the wall time and the
    store (``autotune.calibrate`` adds each family's answer)."""

    fingerprint: Fingerprint
    measurements: dict[str, FamilyResult]
    wall_s: float
    store_path: str


def run_calibration(
    families: Sequence[Family],
    *,
    force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None,
    on_worker: Callable[[Worker], None] | None = None,
) -> Calibrated:
    """``calibrate`` ``families``, handing its worker to ``on_worker`` first (a background job cancels through
    it): a cancelled worker stops the family in progress and the ones after it with :class:`CalibrationCancelled`."""
    kinds = [family.name for family in families]
    _env.DEVICE.get()  # an invalid device fails before anything is measured
    _env.SEARCH.get()  # an invalid search setting fails before anything is measured
    started = time.perf_counter()
    fp = fingerprint()
    store = _cached.store()
    measurements: dict[str, FamilyResult] = {}
    failed: list[CalibrationError] = []
    now = now_utc()
    keys = {family.name: family_key(family) for family in families}
    cached: dict[str, FamilyResult] = {}
    for family in families:
        # Read once (a miss re-reads under its family's lock); the defaults layer counts as measured here.
        result = None if force else _cached.known(fp, store, family.name)
        if result is None:
            continue
        verdict = freshness(result, keys[family.name], now)
        if verdict.final:
            cached[family.name] = result
        else:
            log.info("measuring %s again: %s", family.name, verdict.why)
    with new_worker() as worker:  # one worker for every family; killed on any exception
        if on_worker is not None:
            on_worker(worker)
        for index, family in enumerate(families):
            if worker.cancelled:
                raise CalibrationCancelled(finished=list(measurements), missing=kinds[index:])
            result = cached.get(family.name)
            if result is None:
                try:
                    result = ensure_measured(family, keys[family.name], fp, store, worker=worker, force=force,
                                             progress=progress, index=index, total=len(families))
                except CalibrationCancelled as exc:  # nothing stored for this family; its lock is released
                    raise CalibrationCancelled(exc.model_kind, finished=list(measurements),
                                               missing=kinds[index:]) from None
                except CalibrationError as exc:  # the fp32 CPU reference failed: nothing stored; the others go on
                    failed.append(exc)
            if result is not None:
                measurements[family.name] = result
            if progress is not None:
                progress(CalibrationProgress(family.name, None, (index + 1) / len(families)))
    if failed:
        raise failed[0]
    return Calibrated(fingerprint=fp, measurements=measurements, wall_s=time.perf_counter() - started,
                      store_path=str(store.path(fp.digest)))


#: the families this process's background jobs calibrate, as many times as jobs hold each (``_background``)
_in_background: Counter[str] = Counter()
_in_background_guard = threading.Lock()


def in_background(kinds: Sequence[str], *, ended: bool = False) -> None:
    """Mark ``kinds`` as calibrated by a background job of this process from its start (:func:`running`); with
    ``ended``, the job's end."""
    with _in_background_guard:
        (_in_background.subtract if ended else _in_background.update)(kinds)


def running(kind: str) -> bool:
    """True while a background job of this process is calibrating ``kind``."""
    with _in_background_guard:
        return _in_background[kind] > 0


def reset() -> None:
    """Forget which families background jobs calibrate (``_background.cancel_all`` ends the jobs first)."""
    with _in_background_guard:
        _in_background.clear()


def measuring_elsewhere(store: Store, digest: str, name: str) -> bool:
    """True while another process (or thread) calibrates ``name`` or measures anything on this machine: a worker
    started now would take CPU from that measurement, and may not be needed at all (``name`` is then read from
    its result). A look, not a claim."""
    return held_elsewhere(store.calibration_lock(digest, name)) or held_elsewhere(measuring_lock())


def new_worker() -> Worker:
    return Worker(isolation=_env.ISOLATION.get(), timeout_s=_env.CANDIDATE_TIMEOUT_S.get())


def ensure_measured(
    family: Family, key: FamilyKey, fp: Fingerprint, store: Store, *, worker: Worker, force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None, index: int = 0, total: int = 1,
) -> FamilyResult | None:
    """The miss path: the family's stored result if it answers for ``key``, else measured in ``worker`` and
    stored, under the family's lock (single flight: a result another process wrote while this one waited is the
    one asked for). The worker starts first, so its interpreter start overlaps taking the lock; not while
    another process measures: this one may then need no worker at all. ``index`` of ``total`` families place
    its progress in a calibration's. None when waiting for another process timed out.

    A noisy result measured again (unforced) records the pick it replaced: it is kept, noisy or not
    (``freshness``). Raises CalibrationError, and stores nothing, when the fp32 CPU reference fails: the next call
    measures again.
    """
    if not measuring_elsewhere(store, fp.digest, family.name):
        worker.start()
    lock = store.calibration_lock(fp.digest, family.name)
    asked_at = dt.datetime.now(dt.timezone.utc).isoformat()
    if lock is not None:  # None: the directory cannot hold a lock (refused, unwritable); calibrate unlocked
        if held_elsewhere(lock):
            log.info("another process or job is calibrating %s on this machine; waiting for its result", family.name)
        if not acquire(lock, cancelled=lambda: worker.cancelled):
            return None
    try:
        stored = store.load(fp.digest)
        existing = stored.families.get(family.name) if stored is not None else None
        noisy_before = None
        # A result written while we waited is the one we asked for, forced or not.
        if existing is not None:
            verdict = freshness(existing, key, now_utc())
            if verdict.answers and (existing.measured_at >= asked_at or (verdict.final and not force)):
                return existing
            if verdict.state == "noisy" and not force:
                with contextlib.suppress(CalibrationError):  # nothing usable to name: measured again as new
                    noisy_before = picked(existing)
        result = measure(family, key, progress=progress, index=index, total=total, worker=worker,
                         processes=fp.processes, cores=fp.usable_cores)
        if noisy_before is not None:
            result = result.model_copy(update={"after_noisy": noisy_before})
        reference = reference_failure(result)
        if reference is not None and reference.failure is not None:
            log.warning("%s: the fp32 CPU reference failed (%s: %s); nothing is stored, the next call measures "
                        "again", family.name, reference.failure.kind, reference.failure.detail)
            raise CalibrationError(family.name, [(r.candidate.label, f"{r.failure.kind}: {r.failure.detail}")
                                                 for r in result.candidates if r.failure is not None])
        store.save(fp, result)
        return result
    finally:
        if lock is not None:
            lock.release()


def measure_family(model_kind: str, *, verify: bool = True) -> FamilyResult:
    """Run one family's calibration now, in a worker of its own, with no cache involved (``verify=False`` runs
    the numerics gate's steps unchecked, to price it)."""
    family = get_family(model_kind)
    with new_worker() as worker:
        return measure(family, family_key(family), verify=verify, worker=worker)


def measure(
    family: Family, key: FamilyKey, *, progress: Callable[[CalibrationProgress], None] | None = None, index: int = 0,
    total: int = 1, verify: bool = True, worker: Worker, processes: int = 1, cores: int = 1,
) -> FamilyResult:
    """Measure ``family`` in ``worker`` (a calibration's shared worker) and stamp the result with ``key``, what it
    was measured for; ``index`` of ``total`` families place its progress in the calibration's. ``processes`` of
    one job share this machine's ``cores``: each CPU candidate is timed with that many running its step, and runs
    with its share of the cores unless it has a count of its own."""
    settings = CalibrationSettings(search=_env.SEARCH.get(), verify=verify,
                                   measure=MeasureSettings(budget_s=_env.BUDGET_S.get()))

    shown = 0.0

    def on_progress(candidate: Candidate | None, fraction: float) -> None:
        nonlocal shown
        shown = max(shown, min(fraction, 0.999))  # a restarted worker starts its count again
        if progress is not None:
            label = candidate.label if candidate is not None else None
            progress(CalibrationProgress(family.name, label, (index + shown) / total))

    log.info("calibrating %s on this machine", family.name)
    # Stamped with what it was measured for (``key`` read the same variables as the settings above) and by which
    # rules (the worker runs this same installation).
    with measuring(cancelled=lambda: worker.cancelled):
        measured = worker.run_family(family, settings, progress=on_progress, processes=processes,
                                     threads=threads_per_process(cores, processes) if processes > 1 else None)
    result = measured.model_copy(update={"key": key, "rules": rules_digest()})
    log.info("calibrated %s in %.1f s", family.name, result.wall_s)
    if result.noisy:
        log.warning("%s was measured %s; %s", family.name,
                    noise_words(result.noisy_because, result.loads, result.control_shift),
                    remeasure_advice(result.noisy_because, result.loads))
    return result


__all__ = [
    "Calibrated",
    "CalibrationProgress",
    "ensure_measured",
    "in_background",
    "measure",
    "measure_family",
    "measuring_elsewhere",
    "new_worker",
    "reset",
    "run_calibration",
    "running",
]
