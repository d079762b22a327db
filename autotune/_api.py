"""The public entry points besides ``calibrate``: ``best_config`` (instant from the cache), its fallback
without a measurement, and the cache's tools (cached decisions, export / import, the canary, ``trace``).

It is also an internal entry of the command line (``_cli``), for what the public API does not offer: the
cached measurements and decisions without measuring, the registered kinds, ``--doctor``'s findings, a
measurement's pick and when a failure is retried; and of the tests, to reset this process's state.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from autotune import _background, _env, _fp32
from autotune._cache import batch_answers as _max_batch_answers
from autotune._cache import demotions as _demotions
from autotune._cache import exchange as _exchange
from autotune._cache import lookup as _cached
from autotune._cache.freshness import (
    due_retries,
    family_key,
    fresh_until,
    key_change,
    now_utc,
    retry_at,
    rules_change,
    stale_reason,
)
from autotune._cache.locks import held_elsewhere
from autotune._cache.lookup import Similar, find_similar
from autotune._cache.store import Store
from autotune._calibrate import calibrate_one, measuring_elsewhere, new_worker, run_calibration
from autotune._config import Config
from autotune._decide import PREFERENCES, Prefer, decide, finalists, picked, restate, step_ms
from autotune._doctor import Finding, diagnose
from autotune._errors import CalibrationError, ConfigurationError
from autotune._families import Family, builtin_family_names, family_names, get_family, reset_registry
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._lab.protocol import TraceJob
from autotune._records import (
    Candidate,
    CandidateResult,
    Demotion,
    Difference,
    Evidence,
    FamilyResult,
    SimilarMachine,
    TraceReport,
)
from autotune._rules import preference
from autotune._tools import canary as _check
from autotune._tools.canary import CheckResult
from autotune._wording import reason

log = logging.getLogger("autotune")


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
    return config_for(get_family(model_kind), prefer=prefer, expected_steps=expected_steps,
                      calibrate_on_miss=calibrate_on_miss, wait=wait)


def config_for(family: Family, *, prefer: Prefer = "auto", expected_steps: int | None = None,
               calibrate_on_miss: bool = True, wait: bool = True) -> Config:
    """``best_config`` of a resolved family, with validated arguments."""
    fp = fingerprint()
    store = _cached.store()
    forced = _env.DEVICE.get()
    may_measure = wait and calibrate_on_miss
    # The key's parts as a plain tuple: building the FamilyKey model is left to a miss (the warm path is µs).
    key_parts = (family.ref, family.version, _env.SEARCH.get(), _env.BUDGET_S.get())
    memo = (str(store.root), fp.digest, family.name, key_parts, prefer, expected_steps, forced, may_measure,
            _exchange.layer_stamp(), _demotions.stamp(fp.digest, store.root), store.stamp(fp.digest))
    cached = _cached.decisions.get(memo)
    if cached is not None and (cached[1] is None or now_utc() < cached[1]):
        return cached[0]
    key = family_key(family)
    measured = _cached.known(fp, store, family.name)
    now = now_utc()
    if measured is not None and (changed := key_change(measured, key)) is not None:
        log.info("measuring %s again: %s", family.name, changed)
        measured = None
    if measured is None or (may_measure and due_retries(measured, now)):
        if not may_measure:
            why = _why_unmeasured(family.name, fp, store) if not wait else \
                "calibration not allowed by calibrate_on_miss=False"
            return fallback(family.name, fp, store, why, prefer=prefer, expected_steps=expected_steps)
        with new_worker() as worker:
            # Its interpreter start overlaps taking the lock; not while another process measures this family:
            # then this one waits for that result and may need no worker at all.
            if not measuring_elsewhere(store, fp.digest, family.name):
                worker.start()
            measured = calibrate_one(family, key, fp, store, force=False, progress=None, index=0, total=1,
                                      worker=worker)
        if measured is None:
            return fallback(family.name, fp, store, "another process is still calibrating after "
                            f"AUTOTUNE_LOCK_TIMEOUT_S={_env.LOCK_TIMEOUT_S.get():g} s of waiting",
                            prefer=prefer, expected_steps=expected_steps)
        memo = (*memo[:-1], store.stamp(fp.digest))
    config = decided(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=fp.digest)
    # A transient failure's retry is due later: the memo answers until then, so a long-running app retries too.
    _cached.decisions[memo] = (config, fresh_until(measured) if may_measure else None)
    return config


def decided(measured: FamilyResult, *, prefer: Prefer, expected_steps: int | None, forced_device: str | None,
            digest: str) -> Config:
    """The decision on ``measured`` without what training runs demoted on this machine; then the reason is the
    latest demotion, e.g. "bf16-mixed was demoted after NaN losses at step 5,120 of training on 2026-12-03; using
    fp32". One measured under older rules says so (it still answers until the next calibration replaces it)."""
    demoted = _demotions.of(digest, measured.model_kind)
    config = decide(without(measured, demoted), prefer=prefer, expected_steps=expected_steps,
                    forced_device=forced_device, digest=digest)
    if rules_change(measured) is not None:
        config = restate(config, older_rules=measured.autotune_version)
    if not demoted:
        return config
    latest = demoted[-1]
    same_device = latest.candidate.device == config.device
    was = latest.candidate.precision if same_device else f"{latest.candidate.device} {latest.candidate.precision}"
    now = config.precision if same_device else f"{config.device} {config.precision}"
    reason = f"{was} was demoted after {latest.words} at step {latest.step:,} of training on {latest.at[:10]}; using "
    # One sentence under 160 characters: the variants are named only where they fit (the Config lists them all).
    reason += now + config.variant_words if len(reason + now + config.variant_words) < 160 else now
    log.info("%s: %s", measured.model_kind, reason)
    return config.model_copy(update={"reason": reason})


def without(measured: FamilyResult, demoted: list[Demotion]) -> FamilyResult:
    """``measured`` less the demoted candidates (each demotion covers its precision on its device). A device
    left without a finalist gets back its most preferred verified candidate, compared on its own timing: what
    was pruned as slower than a demoted candidate is the best that device has left."""
    if not demoted:
        return measured
    kept = [r for r in measured.candidates if not any(d.covers(r.candidate) for d in demoted)]
    final = finalists(measured.model_copy(update={"candidates": kept}))
    back = []
    for device in dict.fromkeys(r.candidate.device for r in kept if r.usable):
        if not any(r.candidate.device == device for r in final):
            usable = [r for r in kept if r.usable and r.candidate.device == device]
            back.append(min(usable, key=lambda r: (preference(r.candidate), step_ms(r))).candidate)
    restored = [r.model_copy(update={"timing": r.timing.model_copy(update={"dropped": None, "final": True})})
                if r.timing is not None and r.candidate in back else r for r in kept]
    return measured.model_copy(update={"candidates": restored})


def demotions(model_kind: str) -> list[Demotion]:
    """What training runs demoted for ``model_kind`` on this machine, oldest first."""
    return _demotions.of(fingerprint().digest, model_kind)


def forget_demotion(model_kind: str) -> list[Demotion]:
    """Undo the demotions of ``model_kind`` on this machine (``--forget-demotion``); returns what was undone."""
    return _demotions.forget(fingerprint().digest, model_kind)


_NOT_YET = "wait=False never measures"


def _why_unmeasured(kind: str, fp: Fingerprint, store: Store) -> str:
    """"calibration running ..." when this process's job or another process holds the family's lock."""
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
            _exchange.layer_stamp(), store.stamps(), _demotions.stamp(fp.digest, store.root))
    cached = _cached.decisions.get(memo)
    if cached is not None:
        return cached[0]
    config = None
    similar = find_similar(fp, kind, [*store.all_files(), *_exchange.defaults_files()])
    if similar is not None and forced is None:
        try:
            # What training demoted here is not served from another machine's measurement either.
            config = decide(without(similar.result, _demotions.of(fp.digest, kind)), prefer=prefer,
                            expected_steps=expected_steps, digest=fp.digest)
        except CalibrationError:
            config = None
        if config is not None:
            there = SimilarMachine(measured_at=similar.result.measured_at, differences=[
                Difference(name=name, then=then, now=now) for name, then, now in similar.differences])
            config = restate(config.model_copy(update={"source": "heuristic"}), unmeasured=why, similar=there)
    if config is None:
        fp32 = Candidate(device="cpu", precision="fp32")
        evidence = Evidence(unmeasured=why)
        config = Config(**fp32.model_dump(), model_kind=kind, source="heuristic", evidence=evidence,
                        reason=reason(fp32, evidence, measured_at=None), fingerprint_digest=fp.digest)
    log.warning("%s: %s", kind, config.reason)
    _cached.decisions[memo] = (config, None)
    return config


def clear_cache() -> list[str]:
    """Delete every stored measurement of every machine configuration (max-batch answers and demotions too);
    returns the removed paths."""
    _cached.decisions.clear()
    return [str(p) for p in _cached.store().clear()] + _max_batch_answers.clear() + _demotions.clear()


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
        kind: decided(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=digest)
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
    config = config_for(family)
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
    job = TraceJob(family=family, candidate=chosen, init_scale=init_scale,
                   path=str(path), fp32=_fp32.current(), sys_path=[p for p in sys.path if p])
    with new_worker() as worker:
        return worker.run_trace(job)


def export_results(path: str | Path, model_kinds: Iterable[str] | None = None) -> int:
    """Write the stored results of every machine configuration (only ``model_kinds`` if given) to ``path``,
    each with its fingerprint, for ``import_results`` or ``AUTOTUNE_DEFAULTS`` elsewhere; returns the number
    of family records written."""
    export = _exchange.export_results(_cached.store(), Path(path).expanduser(), model_kinds)
    return sum(len(f.families) for f in export.files)


def import_results(path: str | Path) -> _exchange.ImportSummary:
    """Merge an export file into the cache as untrusted input (size cap, schema validated, nothing executed,
    everything checked before the first write); families measured here already are kept."""
    _cached.decisions.clear()
    return _exchange.import_results(_cached.store(), Path(path).expanduser())


def check_cached(model_kinds: Iterable[str] | None = None) -> list[CheckResult]:
    """The canary: re-time each measured family's pick (default: every registered kind measured here) against
    fp32 and the runner-up; a family whose pick is no longer within the margin is calibrated again."""
    known = set(family_names())
    measured = {get_family(k): r for k, r in cached_families(model_kinds, fresh_only=True).items()
                if k in known and r.origin is None}
    results = _check.check(measured)
    stale = {r.model_kind for r in results if r.verdict == "recalibrated"}
    if not stale:
        return results
    report = run_calibration([family for family in measured if family.name in stale], force=True)
    return [r.model_copy(update={"new_pick": report.configs[r.model_kind].candidate.label})
            if r.model_kind in report.configs else r for r in results]


def similar_record(model_kind: str) -> Similar | None:
    """A record of ``model_kind`` from the same hardware with other software (cache or defaults layer)."""
    store = _cached.store()
    return find_similar(fingerprint(), model_kind, [*store.all_files(), *_exchange.defaults_files()])


def cached_families(model_kinds: Iterable[str] | None = None, *, fresh_only: bool = False) -> dict[str, FamilyResult]:
    """The stored measurements of this machine, without measuring anything.

    ``fresh_only``: leave out what the next calibration would measure again (another build, version, search or
    budget; older rules; a transient failure due for a retry).
    """
    stored = _cached.store().load(fingerprint().digest)
    if stored is None:
        return {}
    wanted = set(model_kinds) if model_kinds is not None else None
    found = {k: v for k, v in stored.families.items() if wanted is None or k in wanted}
    if not fresh_only:
        return found
    now, registered = now_utc(), set(family_names())
    return {k: v for k, v in found.items()
            if k in registered and stale_reason(v, family_key(get_family(k)), now) is None}


def reset_state() -> None:
    """Forget what this process keeps between calls: its background calibrations (cancelled, waited for), the
    decision memo and the stores, demotions it could not write, families it registered, and ``use_defaults``.
    Tests call it around each test, which runs in a cache directory of its own."""
    _background.cancel_all(timeout_s=60)
    _cached.reset()
    _demotions.reset()
    _exchange.reset()
    reset_registry()


__all__ = [
    "CandidateResult",
    "Demotion",
    "FamilyResult",
    "Finding",
    "Prefer",
    "best_config",
    "builtin_family_names",
    "cached_configs",
    "cached_families",
    "check_cached",
    "clear_cache",
    "config_for",
    "decided",
    "demotions",
    "diagnose",
    "export_results",
    "fallback",
    "family_names",
    "forget_demotion",
    "import_results",
    "picked",
    "reset_state",
    "retry_at",
    "similar_record",
    "trace",
    "without",
]
