"""The public entry points: ``best_config`` (instant from the cache) and ``calibrate`` (first launch)."""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import _env, _exchange, _stats
from autotune._config import Config
from autotune._decide import PREFERENCES, Prefer, decide
from autotune._errors import CalibrationCancelled, CalibrationError, ConfigurationError
from autotune._families import Family, builtin_family_names, family_names, get_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._freshness import (
    due_retries,
    family_key,
    fresh_until,
    key_change,
    now_utc,
    reference_failure,
    stale_reason,
)
from autotune._locks import acquire, held_elsewhere, measuring, measuring_lock
from autotune._models import Candidate, FamilyKey, FamilyResult, Record, TraceReport
from autotune._similar import Similar, find_similar
from autotune._store import Store, default_root

if TYPE_CHECKING:
    from autotune._calibration.worker import Worker
    from autotune._canary import CheckResult

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


# Warm-path memo: (root, digest, kind, family key parts, prefer, steps, forced, file stamp) -> (Config, good until).
# A write by another process changes the file's stamp, which is the only check a repeated call pays for besides
# the fingerprint.
_decisions: dict[tuple[object, ...], tuple[Config, dt.datetime | None]] = {}
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
    model_kind: str, *, prefer: Prefer = "auto", expected_steps: int | None = None, calibrate_on_miss: bool = True,
    wait: bool = True,
) -> Config:
    """The fastest correct device and precision for ``model_kind`` on this machine.

    Answered from the cache when this machine (its fingerprint) has measured this family before, or from the
    defaults layer (``AUTOTUNE_DEFAULTS``) when it holds a record of exactly this machine configuration;
    otherwise the family is calibrated first (seconds to a minute). ``wait=False`` never measures and never
    waits for another process's calibration: without a measurement it answers at once with a ``heuristic``
    Config whose reason says why ("calibration running", "not measured yet") and what it is based on (a
    record of the same hardware with other software, else fp32 on the CPU); ``calibrate_on_miss=False`` is the
    older spelling. ``prefer`` is the user's choice ("auto", "gpu" or "cpu"), not a backend;
    ``expected_steps`` makes set-up cost count for short jobs.
    """
    _validate(prefer, expected_steps)
    family = get_family(model_kind)
    fp = fingerprint()
    store = _store()
    forced = _env.DEVICE.get()
    may_measure = wait and calibrate_on_miss
    # The key's parts as a plain tuple: building the FamilyKey model is left to a miss (the warm path is µs).
    key_parts = (family.ref, family.version, _env.SEARCH.get(), _env.BUDGET_S.get())
    memo = (str(store.root), fp.digest, family.name, key_parts, prefer, expected_steps, forced, may_measure,
            _exchange.layer_stamp(), store.stamp(fp.digest))
    cached = _decisions.get(memo)
    if cached is not None and (cached[1] is None or now_utc() < cached[1]):
        return cached[0]
    key = family_key(family)
    measured = _known(fp, store, family.name)
    now = now_utc()
    if measured is not None and (changed := key_change(measured, key)) is not None:
        log.info("measuring %s again: %s", family.name, changed)
        measured = None
    if measured is None or (may_measure and due_retries(measured, now)):
        if not may_measure:
            why = _why_unmeasured(family.name, fp, store) if not wait else \
                "calibration was not allowed (calibrate_on_miss=False)"
            return fallback(family.name, fp, store, why, prefer=prefer, expected_steps=expected_steps)
        with _new_worker() as worker:
            # Its interpreter start overlaps taking the lock; not while another process measures this family:
            # then this one waits for that result and may need no worker at all.
            if not _measuring_elsewhere(store, fp.digest, family.name):
                worker.start()
            measured = _calibrate_one(family, key, fp, store, force=False, progress=None, index=0, total=1,
                                      worker=worker)
        if measured is None:
            return fallback(family.name, fp, store, "another process is still calibrating and the wait timed out "
                            f"after {_env.LOCK_TIMEOUT_S.get():g} s (AUTOTUNE_LOCK_TIMEOUT_S)",
                            prefer=prefer, expected_steps=expected_steps)
        memo = (*memo[:-1], store.stamp(fp.digest))
    config = decide(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=fp.digest)
    if measured.origin is not None:
        config = config.model_copy(update={"reason": f"{config.reason} Measured on another machine with exactly "
                                                     f"this configuration; {measured.origin}."})
    # A transient failure's retry is due later: the memo answers until then, so a long-running app retries too.
    _decisions[memo] = (config, fresh_until(measured) if may_measure else None)
    return config


def _known(fp: Fingerprint, store: Store, kind: str) -> FamilyResult | None:
    """This machine configuration's record of ``kind``: the user's cache first, then the defaults layer."""
    stored = store.load(fp.digest)
    measured = stored.families.get(kind) if stored is not None else None
    return measured if measured is not None else _exchange.defaults_record(fp.digest, kind)


_NOT_YET = "not measured yet; wait=False never measures"


def _why_unmeasured(kind: str, fp: Fingerprint, store: Store) -> str:
    """"calibration running ..." when this process's job or another process holds the family's lock."""
    from autotune import _background

    if _background.running(kind):
        return "calibration running in this process"
    if held_elsewhere(store.calibration_lock(fp.digest, kind)):
        return "calibration running in another process"
    return _NOT_YET


def fallback(kind: str, fp: Fingerprint, store: Store, why: str, *, prefer: Prefer = "auto",
             expected_steps: int | None = None) -> Config:
    """The best answer without a measurement of this machine configuration: the pick measured on the same
    hardware with other software (the reason names the differences), else fp32 on the CPU."""
    forced = _env.DEVICE.get()
    memo = ("fallback", str(store.root), fp.digest, kind, prefer, expected_steps, forced, why,
            _exchange.layer_stamp(), store.stamps())
    cached = _decisions.get(memo)
    if cached is not None:
        return cached[0]
    config = None
    similar = find_similar(fp, kind, [*store.all_files(), *_exchange.defaults_files()])
    if similar is not None and forced is None:
        try:
            config = decide(similar.result, prefer=prefer, expected_steps=expected_steps, digest=fp.digest)
        except CalibrationError:
            config = None
        if config is not None:
            reason = (f"No measurement of this machine configuration ({why}): using the pick measured on the "
                      f"same hardware ({similar.then_and_now()}). There: {config.reason}")
            config = config.model_copy(update={"source": "heuristic", "reason": reason})
    if config is None:
        reason = f"No measurement of this machine configuration ({why}): using fp32 on the CPU, which always trains."
        config = Config(model_kind=kind, device="cpu", precision="fp32", source="heuristic", reason=reason,
                        fingerprint_digest=fp.digest)
    log.warning("%s: %s", kind, config.reason)
    _decisions[memo] = (config, None)
    return config


def calibrate(
    model_kinds: Sequence[str] | None = None,
    *,
    force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None,
) -> CalibrationReport:
    """Measure each family (default: the built-ins) on this machine, for an app's first launch.

    Families already measured on this machine for the same key (build, ``version=``, search, budget) are reused
    unless ``force=True``, or unless they were measured while the machine was busy (``noisy``): those are
    measured again (``best_config`` serves them meanwhile). A candidate that timed out, crashed or ran out of
    memory more than a day ago is tried again. ``progress`` receives a :class:`CalibrationProgress` as each
    candidate starts, for a progress bar. A failure of the fp32 CPU reference raises CalibrationError (after
    the other families) and is not stored. To calibrate without blocking, see :func:`autotune.start_calibration`.
    """
    return run_calibration(model_kinds, force=force, progress=progress)


def run_calibration(
    model_kinds: Sequence[str] | None = None,
    *,
    force: bool = False,
    progress: Callable[[CalibrationProgress], None] | None = None,
    on_worker: Callable[[Worker], None] | None = None,
) -> CalibrationReport:
    """``calibrate``, handing its worker to ``on_worker`` first (a background job cancels through it): a
    cancelled worker stops the family in progress and the ones after it with :class:`CalibrationCancelled`."""
    kinds = list(model_kinds) if model_kinds is not None else builtin_family_names()
    families = [get_family(kind) for kind in kinds]  # unknown names fail before anything is measured
    forced = _env.DEVICE.get()
    _env.SEARCH.get()  # an invalid search setting fails before anything is measured
    started = time.perf_counter()
    fp = fingerprint()
    store = _store()
    measurements: dict[str, FamilyResult] = {}
    failed: list[CalibrationError] = []
    now = now_utc()
    cached: dict[str, FamilyResult] = {}
    for family in families:
        # Read once (a miss re-reads under its family's lock); the defaults layer counts as measured here.
        result = None if force else _known(fp, store, family.name)
        if result is None:
            continue
        # A noisy result serves best_config, but is measured again here; so is one measured for another key
        # or holding a transient failure due for a retry.
        why = "it was measured on a busy machine" if result.noisy else stale_reason(result, family_key(family), now)
        if why is None:
            cached[family.name] = result
        else:
            log.info("measuring %s again: %s", family.name, why)
    with _new_worker() as worker:  # one worker for every family; killed on any exception
        if on_worker is not None:
            on_worker(worker)
        pending = [family for family in families if family.name not in cached]
        # First, so its interpreter start overlaps everything else; but not while another process measures the
        # first family: this one waits for that result and may need no worker at all (nor take CPU from that
        # measurement). It then starts when a family needs it.
        if pending and not _measuring_elsewhere(store, fp.digest, pending[0].name):
            worker.start()
        for index, family in enumerate(families):
            if worker.cancelled:
                raise CalibrationCancelled(finished=list(measurements), missing=kinds[index:])
            result = cached.get(family.name)
            if result is None:
                try:
                    result = _calibrate_one(family, family_key(family), fp, store, force=force, progress=progress,
                                            index=index, total=len(families), worker=worker)
                except CalibrationCancelled as exc:  # nothing stored for this family; its lock is released
                    raise CalibrationCancelled(exc.model_kind, finished=list(measurements),
                                               missing=kinds[index:]) from None
                except CalibrationError as exc:  # the fp32 CPU reference failed: nothing stored; the others go on
                    failed.append(exc)
            if result is not None:
                measurements[family.name] = result
            if progress is not None:
                progress(CalibrationProgress(family.name, None, (index + 1) / len(families)))
    _decisions.clear()
    if failed:
        raise failed[0]
    configs = {kind: decide(m, forced_device=forced, digest=fp.digest) for kind, m in measurements.items()}
    return CalibrationReport(
        fingerprint=fp, measurements=measurements, configs=configs,
        wall_s=time.perf_counter() - started, store_path=str(store.path(fp.digest)),
    )


def _measuring_elsewhere(store: Store, digest: str, name: str) -> bool:
    """True while another process (or thread) calibrates ``name`` or measures anything on this machine: a worker
    started now would take CPU from that measurement, and may not be needed at all (``name`` is then read from
    its result). A look, not a claim."""
    return held_elsewhere(store.calibration_lock(digest, name)) or held_elsewhere(measuring_lock())


def _new_worker() -> Worker:
    from autotune._calibration.worker import Worker

    return Worker(isolation=_env.ISOLATION.get(), timeout_s=_env.CANDIDATE_TIMEOUT_S.get())


def _calibrate_one(
    family: Family, key: FamilyKey, fp: Fingerprint, store: Store, *, force: bool,
    progress: Callable[[CalibrationProgress], None] | None, index: int, total: int, worker: Worker,
) -> FamilyResult | None:
    """Calibrate under the family's lock (single flight); None when waiting for another process timed out.

    Raises CalibrationError, and stores nothing, when the fp32 CPU reference fails: the next call measures again.
    """
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
        # A result written while we waited is the one we asked for, forced or not; a noisy one is not final,
        # nor one measured for another key or holding a transient failure due for a retry.
        if existing is not None and key_change(existing, key) is None and (
            existing.measured_at >= asked_at
            or not (force or existing.noisy or stale_reason(existing, key, now_utc()) is not None)
        ):
            return existing
        result = measure_family(family.name, progress=progress, index=index, total=total, worker=worker)
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
    # Stamped here with what it was measured for: the settings above come from the same variables.
    with measuring(cancelled=lambda: worker.cancelled):
        measured = worker.run_family(family, settings, progress=on_progress)
    result = measured.model_copy(update={"key": family_key(family)})
    log.info("calibrated %s in %.1f s", model_kind, result.wall_s)
    if result.noisy:
        drift = _stats.drift(result.control_ms)
        log.warning("%s was measured while the machine was busy (%s); run `python -m autotune --recalibrate` on "
                    "a quiet machine for a firmer answer", model_kind,
                    f"control workload drifted {100 * drift:.0f}%" if drift > settings.measure.noise_limit else
                    "the final comparison could not resolve a gap beyond the margin")
    return result


def clear_cache() -> list[str]:
    """Delete every stored measurement of every machine configuration (max-batch answers too); returns the
    removed paths."""
    from autotune import _max_batch

    _decisions.clear()
    return [str(p) for p in _store().clear()] + _max_batch.clear_cache()


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


def export_results(path: str | Path, model_kinds: Iterable[str] | None = None) -> int:
    """Write the stored results of every machine configuration (only ``model_kinds`` if given) to ``path``,
    each with its fingerprint, for ``import_results`` or ``AUTOTUNE_DEFAULTS`` elsewhere; returns the number
    of family records written."""
    export = _exchange.export_results(_store(), Path(path).expanduser(), model_kinds)
    return sum(len(f.families) for f in export.files)


def import_results(path: str | Path) -> _exchange.ImportSummary:
    """Merge an export file into the cache as untrusted input (size cap, schema validated, nothing executed,
    everything checked before the first write); families measured here already are kept."""
    _decisions.clear()
    return _exchange.import_results(_store(), Path(path).expanduser())


def check_cached(model_kinds: Iterable[str] | None = None) -> list[CheckResult]:
    """The canary: re-time each measured family's pick (default: every registered kind measured here) against
    fp32 and the runner-up; a family whose pick is no longer within the margin is calibrated again."""
    from autotune import _canary

    known = set(family_names())
    measured = {k: r for k, r in cached_families(model_kinds, fresh_only=True).items()
                if k in known and r.origin is None}
    results = _canary.check(measured, fingerprint().digest)
    stale = [r.model_kind for r in results if r.verdict == "recalibrated"]
    if not stale:
        return results
    report = calibrate(stale, force=True)
    return [r.model_copy(update={"new_pick": report.configs[r.model_kind].candidate.label})
            if r.model_kind in report.configs else r for r in results]


def similar_record(model_kind: str) -> Similar | None:
    """A record of ``model_kind`` from the same hardware with other software (cache or defaults layer)."""
    store = _store()
    return find_similar(fingerprint(), model_kind, [*store.all_files(), *_exchange.defaults_files()])


def cached_families(model_kinds: Iterable[str] | None = None, *, fresh_only: bool = False) -> dict[str, FamilyResult]:
    """The stored measurements of this machine, without measuring anything.

    ``fresh_only``: leave out what the next calibration would measure again (another build, version, search or
    budget; a transient failure due for a retry).
    """
    stored = _store().load(fingerprint().digest)
    if stored is None:
        return {}
    wanted = set(model_kinds) if model_kinds is not None else None
    found = {k: v for k, v in stored.families.items() if wanted is None or k in wanted}
    if not fresh_only:
        return found
    now, registered = now_utc(), set(family_names())
    return {k: v for k, v in found.items()
            if k in registered and stale_reason(v, family_key(get_family(k)), now) is None}


__all__ = [
    "CalibrationProgress",
    "CalibrationReport",
    "best_config",
    "cached_configs",
    "cached_families",
    "calibrate",
    "check_cached",
    "clear_cache",
    "export_results",
    "fallback",
    "import_results",
    "run_calibration",
    "similar_record",
    "trace",
]
