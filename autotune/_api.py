"""The public entry points: ``best_config`` (instant from the cache) and ``calibrate`` (first launch)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from pathlib import Path

from autotune import _env, _stats
from autotune._config import Config
from autotune._decide import PREFERENCES, Prefer, decide, heuristic
from autotune._errors import ConfigurationError
from autotune._families import builtin_family_names, get_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._models import Candidate, FamilyResult, Record, TraceReport
from autotune._store import Store, default_root
from autotune._version import __version__

if TYPE_CHECKING:
    from autotune._calibration.worker import Worker

log = logging.getLogger("autotune")



@dataclass(frozen=True)
class CalibrationProgress:
    """Handed to ``calibrate(progress=...)``: e.g. ``family='cnn', candidate='cpu bf16-mixed', fraction=0.4``.

    ``fraction`` is the share of the whole calibration done, from 0 to 1, never decreasing.
    """

    family: str
    candidate: str | None
    fraction: float


class CalibrationReport(Record):
    """What ``calibrate`` measured: the fingerprint, each family's measurements and auto-preference Config."""

    fingerprint: Fingerprint
    measurements: dict[str, FamilyResult]
    configs: dict[str, Config]
    wall_s: float
    store_path: str


# Warm-path memo: (root, digest, kind, prefer, steps, forced, file stamp) -> Config. A write by another process
# changes the file's stamp, which is the only check a repeated call pays for besides the fingerprint.
_decisions: dict[tuple[object, ...], Config] = {}
_stores: dict[str, Store] = {}


def _store() -> Store:
    root = default_root()
    store = _stores.get(str(root))
    if store is None:
        store = _stores[str(root)] = Store(root)
    return store


def _validate(prefer: str, expected_steps: int | None) -> None:
    if prefer not in PREFERENCES:
        raise ConfigurationError("prefer", prefer, " | ".join(PREFERENCES))
    if expected_steps is not None and (isinstance(expected_steps, bool) or not isinstance(expected_steps, int)
                                       or expected_steps < 1):
        raise ConfigurationError("expected_steps", expected_steps, "a positive int or None")


def best_config(
    model_kind: str, *, prefer: Prefer = "auto", expected_steps: int | None = None, calibrate_on_miss: bool = True
) -> Config:
    """The fastest correct device and precision for ``model_kind`` on this machine.

    Answered from the cache when this machine (its fingerprint) has measured this family before; otherwise
    the family is calibrated first (seconds to a minute), unless ``calibrate_on_miss=False``, which answers
    with a ``heuristic`` Config at once. ``prefer`` is the user's choice ("auto", "gpu" or "cpu"), not a
    backend; ``expected_steps`` makes set-up cost count for short jobs.
    """
    _validate(prefer, expected_steps)
    family = get_family(model_kind)
    fp = fingerprint()
    store = _store()
    forced = _env.DEVICE.get()
    key = (str(store.root), fp.digest, family.name, prefer, expected_steps, forced, store.stamp(fp.digest))
    cached = _decisions.get(key)
    if cached is not None:
        return cached
    stored = store.load(fp.digest)
    measured = stored.families.get(family.name) if stored is not None else None
    if measured is None:
        if not calibrate_on_miss:
            return heuristic(family.name, "calibration was not allowed (calibrate_on_miss=False)", fp.digest)
        with _new_worker() as worker:
            worker.start()  # its interpreter start overlaps taking the lock
            measured = _calibrate_one(family.name, fp, store, force=False, progress=None, index=0, total=1,
                                      worker=worker)
        if measured is None:
            return heuristic(family.name, "another process is still calibrating and the wait timed out "
                                          f"after {_env.LOCK_TIMEOUT_S.get():.0f} s (AUTOTUNE_LOCK_TIMEOUT_S)", fp.digest)
        key = key[:-1] + (store.stamp(fp.digest),)
    config = decide(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=fp.digest)
    _decisions[key] = config
    return config


def calibrate(
    model_kinds: Sequence[str] | None = None,
    *,
    force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None,
) -> CalibrationReport:
    """Measure each family (default: the built-ins) on this machine, for an app's first launch.

    Families already measured on this machine are reused unless ``force=True``, or unless they were measured
    while the machine was busy (``noisy``): those are measured again (``best_config`` serves them meanwhile).
    ``progress`` receives a :class:`CalibrationProgress` as each candidate starts, for a progress bar.
    """
    kinds = list(model_kinds) if model_kinds is not None else builtin_family_names()
    families = [get_family(kind) for kind in kinds]  # unknown names fail before anything is measured
    forced = _env.DEVICE.get()
    _env.SEARCH.get()  # an invalid search setting fails before anything is measured
    started = time.perf_counter()
    fp = fingerprint()
    store = _store()
    measurements: dict[str, FamilyResult] = {}
    stored = None if force else store.load(fp.digest)  # read once; a miss re-reads under its family's lock
    # A noisy result serves best_config, but is measured again here.
    cached = {f.name: r for f in families
              if stored is not None and (r := stored.families.get(f.name)) is not None and not r.noisy}
    with _new_worker() as worker:  # one worker for every family; killed on any exception
        if len(cached) < len(families):
            worker.start()  # first: its interpreter start overlaps everything else
        for index, family in enumerate(families):
            result = cached.get(family.name) or _calibrate_one(
                family.name, fp, store, force=force, progress=progress, index=index, total=len(families),
                worker=worker)
            if result is not None:
                measurements[family.name] = result
            if progress is not None:
                progress(CalibrationProgress(family.name, None, (index + 1) / len(families)))
    _decisions.clear()
    configs = {kind: decide(m, forced_device=forced, digest=fp.digest) for kind, m in measurements.items()}
    return CalibrationReport(
        fingerprint=fp, measurements=measurements, configs=configs,
        wall_s=time.perf_counter() - started, store_path=str(store.path(fp.digest)),
    )


def _new_worker() -> Worker:
    from autotune._calibration.worker import Worker

    return Worker(isolation=_env.ISOLATION.get(), timeout_s=_env.CANDIDATE_TIMEOUT_S.get())


def _calibrate_one(
    model_kind: str, fp: Fingerprint, store: Store, *, force: bool,
    progress: Callable[[CalibrationProgress], None] | None, index: int, total: int, worker: Worker,
) -> FamilyResult | None:
    """Calibrate under the family's lock (single flight); None when waiting for another process timed out."""
    import filelock

    lock = store.calibration_lock(fp.digest, model_kind)
    asked_at = dt.datetime.now(dt.timezone.utc).isoformat()
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        log.info("another process is calibrating %s on this machine; waiting for its result", model_kind)
        try:
            lock.acquire(timeout=_env.LOCK_TIMEOUT_S.get())
        except filelock.Timeout:
            return None
    try:
        stored = store.load(fp.digest)
        existing = stored.families.get(model_kind) if stored is not None else None
        # A result written while we waited is the one we asked for, forced or not; a noisy one is not final.
        if existing is not None and (existing.measured_at >= asked_at or not (force or existing.noisy)):
            return existing
        result = measure_family(model_kind, progress=progress, index=index, total=total, worker=worker)
        store.save(fp, result)
        return result
    finally:
        lock.release()


def measure_family(
    model_kind: str, *, progress: Callable[[CalibrationProgress], None] | None = None, index: int = 0, total: int = 1,
    verify: bool = True, worker: Worker | None = None,
) -> FamilyResult:
    """Run one family's calibration now, with no cache involved (``verify=False``: benchmarks only), in
    ``worker`` (a calibration's shared worker) or in a worker of its own."""
    from autotune._calibration.measure import MeasureSettings
    from autotune._calibration.protocol import CalibrationSettings

    if worker is None:
        with _new_worker() as own:
            return measure_family(model_kind, progress=progress, index=index, total=total, verify=verify, worker=own)

    family = get_family(model_kind)
    settings = CalibrationSettings(search=_env.SEARCH.get(), verify=verify,
                                   measure=MeasureSettings(budget_s=_env.BUDGET_S.get()))

    shown = 0.0

    def on_progress(candidate: Candidate | None, fraction: float) -> None:
        nonlocal shown
        shown = max(shown, min(fraction, 0.999))  # a restarted worker starts its count again
        if progress is not None:
            label = candidate.label if candidate is not None else None
            progress(CalibrationProgress(model_kind, label, (index + shown) / total))

    log.info("calibrating %s on this machine", model_kind)
    result = worker.run_family(family, settings, progress=on_progress)
    log.info("calibrated %s in %.1f s", model_kind, result.wall_s)
    if result.noisy:
        log.warning("%s was measured while the machine was busy (control workload drifted %.0f%%); "
                    "run `python -m autotune --recalibrate` on a quiet machine for a firmer answer",
                    model_kind, 100 * _stats.drift(result.control_ms))
    return result


def clear_cache() -> list[str]:
    """Delete every stored measurement of every machine configuration; returns the removed paths."""
    _decisions.clear()
    return [str(p) for p in _store().clear()]


def cached_configs(
    model_kinds: Iterable[str] | None = None, *, prefer: Prefer = "auto", expected_steps: int | None = None
) -> dict[str, Config]:
    """Decisions for the model kinds measured on this machine, without measuring anything.

    Kinds an app registered in its own process are included: the cache keeps results per kind name, and a
    decision needs only the measurements (only measuring again needs the kind's ``build``).
    """
    _validate(prefer, expected_steps)
    forced = _env.DEVICE.get()
    digest = fingerprint().digest
    return {
        kind: decide(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=digest)
        for kind, measured in cached_families(model_kinds).items()
    }


def trace(model_kind: str, *, out_dir: str | Path = ".", candidate: str | None = None) -> TraceReport:
    """Profile ``model_kind``'s picked configuration (calibrating on a miss) for a few training steps.

    ``candidate`` names another measured candidate by its label instead, e.g. ``"cpu fp32"``. The step runs
    in a fresh worker under ``torch.profiler`` (warm-up steps outside the trace, CPU and device activity); a
    Chrome trace is written under ``out_dir`` (open it in https://ui.perfetto.dev or ``chrome://tracing``)
    and the report lists the operators with the most self time per step.
    """
    family = get_family(model_kind)
    config = best_config(model_kind)
    chosen, init_scale = config.candidate, config.init_scale
    if candidate is not None:
        measured = cached_families([model_kind]).get(model_kind)
        results = {r.candidate.label: r for r in (measured.candidates if measured is not None else [])}
        if candidate not in results:
            raise ConfigurationError("candidate", candidate, f"a candidate measured for {model_kind}: "
                                     + ", ".join(results))
        chosen = results[candidate].candidate
        numerics = results[candidate].numerics
        init_scale = numerics.init_scale if numerics is not None else None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", chosen.label)
    path = Path(out_dir).expanduser().resolve() / f"trace-{model_kind}-{slug}-{stamp}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError("out_dir", str(out_dir), f"a directory this user can write ({exc})") from exc
    log.info("tracing %s on %s into %s", model_kind, chosen.label, path)
    from autotune import _fp32
    from autotune._calibration.protocol import FamilyRef, TraceJob

    job = TraceJob(family=FamilyRef(name=family.name, ref=family.ref), candidate=chosen, init_scale=init_scale,
                   path=str(path), fp32=_fp32.current(), sys_path=[p for p in sys.path if p])
    with _new_worker() as worker:
        return worker.run_trace(job)


def cached_families(model_kinds: Iterable[str] | None = None) -> dict[str, FamilyResult]:
    """The stored measurements of this machine, without measuring anything."""
    stored = _store().load(fingerprint().digest)
    if stored is None:
        return {}
    wanted = set(model_kinds) if model_kinds is not None else None
    return {k: v for k, v in stored.families.items() if wanted is None or k in wanted}


__all__ = [
    "CalibrationProgress",
    "CalibrationReport",
    "best_config",
    "cached_configs",
    "cached_families",
    "calibrate",
    "clear_cache",
    "trace",
]
