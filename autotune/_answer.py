"""One way to an answer: a family on this machine -> a Decision (``autotune.best_config`` makes it a Config).

From the cache when a measurement of this machine configuration still answers (``_cache.freshness``), through
the one miss path (``_calibrate.ensure_measured``) when it does not and measuring is allowed, else from what
is known without measuring (:func:`fallback`). Decisions are memoised per process, keyed by what they read, so
a warm call costs a fingerprint and a few ``stat`` calls. The calibration machinery loads only on a miss. In a job
of many processes the same way runs on each machine's first rank, for its machine's ranks, and ``_ranks.job`` makes
one answer of them for the job.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch import nn

from autotune import _env
from autotune._cache import demotions as _demotions
from autotune._cache import exchange as _exchange
from autotune._cache import lookup as _lookup
from autotune._cache.freshness import family_key, fresh_until, freshness, now_utc, rules_change
from autotune._cache.locks import held_elsewhere
from autotune._cache.store import Store
from autotune._decide import PREFERENCES, decide, finalists, restate, step_ms
from autotune._decision import Decision
from autotune._errors import CalibrationError, ConfigurationError
from autotune._families import Family, family_names, get_family
from autotune._fingerprint import Fingerprint, fingerprint
from autotune._ranks.group import JobGroup, joined
from autotune._records import FP32_CPU, Demotion, Difference, Evidence, FamilyResult, Prefer, SimilarMachine
from autotune._rules import preference
from autotune._variants import threads_per_process
from autotune._wording import demoted_reason, reason

if TYPE_CHECKING:
    from autotune._ranks.job import Machine

log = logging.getLogger("autotune")

#: what a decision read -> (the Decision, when a transient failure makes it due for a retry); a write by any process
#: changes a stamp in the key, which is the only check a repeated call pays for besides the fingerprint
_decisions: dict[tuple[object, ...], tuple[Decision, dt.datetime | None]] = {}


def _validate(prefer: str, expected_steps: int | None) -> None:
    _env.check_all()
    if prefer not in PREFERENCES:
        raise ConfigurationError("prefer", prefer, " | ".join(PREFERENCES))
    if expected_steps is not None and (isinstance(expected_steps, bool) or not isinstance(expected_steps, int)
                                       or expected_steps < 1):
        raise ConfigurationError("expected_steps", expected_steps, "a positive int or None")


def best_decision(
    model_kind: str, *, model: nn.Module | None = None, prefer: Prefer = "auto", expected_steps: int | None = None,
    calibrate_on_miss: bool = True, wait: bool = True, distributed: bool | None = None,
) -> Decision:
    """What :func:`autotune.best_config` answers, as the decision it wraps in a Config (its arguments checked here)."""
    _validate(prefer, expected_steps)
    signature = None
    if model is not None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (whose demotions apply), got {type(model).__name__}")
        from autotune._guard.model import model_signature  # with a model only: the warm path loads no guard

        signature = model_signature(model)
    return answer(get_family(model_kind), prefer=prefer, expected_steps=expected_steps,
                  may_measure=wait and calibrate_on_miss,
                  unmeasured="calibration not allowed by calibrate_on_miss=False" if wait else None,
                  model=signature, distributed=distributed)


def answer(family: Family, *, prefer: Prefer = "auto", expected_steps: int | None = None, may_measure: bool = True,
           unmeasured: str | None = None, model: str | None = None, distributed: bool | None = None) -> Decision:
    """``best_config`` of a resolved family, with validated arguments. ``may_measure``: a miss goes through the
    miss path; else it falls back, saying why (``unmeasured``; by default what wait=False sees). ``model``: the
    signature of the model whose demotions apply (None: the family's own)."""
    job = joined(required=True) if distributed else None if distributed is False else joined()
    if job is not None:
        from autotune._ranks.job import agreed  # the ranks' agreement: in a job only

        def machine(job: JobGroup) -> Machine:
            return _machine(job, family, prefer=prefer, expected_steps=expected_steps, may_measure=may_measure,
                            unmeasured=unmeasured, model=model)

        return agreed(job, family.name, {"prefer": prefer, "expected_steps": expected_steps, "wait": may_measure,
                                         "model": model, "AUTOTUNE_DEVICE": _env.DEVICE.get()}, machine)
    fp = fingerprint()
    store = _lookup.store()
    forced = _env.DEVICE.get()
    memo = (str(store.root), fp.digest, family.name, family_key(family), prefer, expected_steps, forced, may_measure,
            model, _exchange.layer_stamp(), _demotions.stamp(fp.digest, store.root), store.stamp(fp.digest))
    cached = _decisions.get(memo)
    if cached is not None and (cached[1] is None or now_utc() < cached[1]):
        return cached[0]
    measured = _measured(family, fp, store, prefer=prefer, expected_steps=expected_steps, may_measure=may_measure,
                         unmeasured=unmeasured, model=model)
    if isinstance(measured, Decision):
        return measured
    memo = (*memo[:-1], store.stamp(fp.digest))  # what it read now, which a measurement just wrote
    config = decided(measured, prefer=prefer, expected_steps=expected_steps, forced_device=forced, digest=fp.digest,
                     model=model)
    # A transient failure's retry is due later: the memo answers until then, so a long-running app retries too.
    _decisions[memo] = (config, fresh_until(measured) if may_measure else None)
    return config


def _measured(family: Family, fp: Fingerprint, store: Store, *, prefer: Prefer, expected_steps: int | None,
              may_measure: bool, unmeasured: str | None, model: str | None) -> FamilyResult | Decision:
    """The measurements of ``family`` that answer on ``fp``'s machine configuration, measured first on a miss where
    ``may_measure``; else the Decision that falls back (:func:`fallback`; without ``model``'s demotions)."""
    key = family_key(family)
    measured = _lookup.known(fp, store, family.name)
    verdict = freshness(measured, key, now_utc()) if measured is not None else None
    if verdict is not None and verdict.state == "other_key":
        log.info("measuring %s again: %s", family.name, verdict.why)
    if measured is None or (verdict is not None and verdict.measure_first and (may_measure or not verdict.answers)):
        if not may_measure:
            why = unmeasured or _why_unmeasured(family.name, fp, store)
            return fallback(family.name, fp, store, why, prefer=prefer, expected_steps=expected_steps, model=model)
        from autotune._calibrate import ensure_measured, new_worker  # the calibration machinery: on a miss only

        with new_worker() as worker:
            measured = ensure_measured(family, key, fp, store, worker=worker)
        if measured is None:
            return fallback(family.name, fp, store, "another process is still calibrating after "
                            f"AUTOTUNE_LOCK_TIMEOUT_S={_env.LOCK_TIMEOUT_S.get():g} s of waiting",
                            prefer=prefer, expected_steps=expected_steps, model=model)
    return measured


def _machine(job: JobGroup, family: Family, *, prefer: Prefer, expected_steps: int | None, may_measure: bool,
             unmeasured: str | None, model: str | None) -> Machine:
    """What this machine's first rank answers for each rank of its machine in ``job``: measured for as many
    processes as share it, each rank on its own view (its own device of each kind; ``AUTOTUNE_DEVICE`` names the
    kind)."""
    from autotune._ranks.agree import device_counts, own_device, view  # in a job only
    from autotune._ranks.job import Machine

    fp = fingerprint(processes=job.ranks.local_world_size)
    store = _lookup.store()
    counts = device_counts(fp.accelerators)
    measured = _measured(family, fp, store, prefer=prefer, expected_steps=expected_steps, may_measure=may_measure,
                         unmeasured=unmeasured, model=model)
    forced = _env.DEVICE.get()
    own = {}
    for member in job.machine:
        if isinstance(measured, Decision):
            own[member.local_rank] = measured.model_copy(
                update={"device": own_device(measured.device, member.local_rank, counts)})
        else:
            own[member.local_rank] = decided(
                view(measured, member.local_rank, counts), prefer=prefer, expected_steps=expected_steps,
                forced_device=own_device(forced, member.local_rank, counts) if forced is not None else None,
                digest=fp.digest, model=model)
    return Machine(own=own, measured=measured if isinstance(measured, FamilyResult) else None, counts=counts,
                   share=threads_per_process(fp.usable_cores, job.ranks.local_world_size))


def decided(measured: FamilyResult, *, prefer: Prefer, expected_steps: int | None, forced_device: str | None,
            digest: str, model: str | None = None) -> Decision:
    """The decision on ``measured`` without what training runs demoted on this machine for ``model`` (a signature;
    None: the model the family builds); then the reason is the latest demotion, e.g. "bf16-mixed was demoted after
    NaN losses at step 5,120 of training on 2026-12-03; using fp32", and the evidence lists them. One measured under
    older rules says so (it still answers until the next calibration replaces it)."""
    demoted = demotions_of(digest, measured.model_kind, model)
    config = decide(without(measured, demoted), prefer=prefer, expected_steps=expected_steps,
                    forced_device=forced_device, digest=digest)
    if rules_change(measured) is not None:
        config = restate(config, older_rules=measured.autotune_version)
    if not demoted:
        return config
    reason = demoted_reason(demoted[-1], config)
    log.info("%s: %s", measured.model_kind, reason)
    evidence = (config.evidence or Evidence()).model_copy(update={"demotions": demoted})
    return config.model_copy(update={"reason": reason, "evidence": evidence})


def demotions_of(digest: str, kind: str, model: str | None = None) -> list[Demotion]:
    """The demotions of ``kind`` on this machine configuration that hold for ``model`` (a signature), oldest first.
    None, the model the family builds: those recorded for it, and those an older autotune recorded without a
    model; for a family not registered in this process, those recorded as its own model."""
    found = _demotions.of(digest, kind)
    if not found:
        return []
    if any(d.model is not None for d in found):
        from autotune._guard.model import family_model  # builds the family's model: for demotions of a model only

        own = family_model(kind)
    else:
        own = None
    if model is not None and model != own:
        return [d for d in found if d.model == model]
    return [d for d in found if d.model is None or (d.model == own if own is not None else d.family_model)]


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


def _why_unmeasured(kind: str, fp: Fingerprint, store: Store) -> str:
    """"calibration running ..." when this process's job or another process holds the family's lock; the cache
    directory when it cannot be used (its warning says why and what to do)."""
    from autotune._calibrate import running  # loaded already where a job of this process runs

    if running(kind):
        return "calibration running in this process"
    if store.problem() is not None:
        return "the cache directory cannot be used, wait=False never measures"
    if held_elsewhere(store.calibration_lock(fp.digest, kind, unlocked="wait=False answers without knowing whether "
                                             "another process is calibrating it")):
        return "calibration running in another process"
    return "wait=False never measures"


def fallback(kind: str, fp: Fingerprint, store: Store, why: str, *, prefer: Prefer = "auto",
             expected_steps: int | None = None, model: str | None = None) -> Decision:
    """The best answer without a measurement of this machine configuration: the pick measured on the same
    hardware with other software (the reason names the differences), else fp32 on the CPU."""
    forced = _env.DEVICE.get()
    memo = ("fallback", str(store.root), fp.digest, kind, prefer, expected_steps, forced, why, model,
            _exchange.layer_stamp(), store.stamps(), _demotions.stamp(fp.digest, store.root))
    cached = _decisions.get(memo)
    if cached is not None:
        return cached[0]
    config = None
    similar = _lookup.find_similar(fp, kind, [*store.all_files(), *_exchange.defaults_files()])
    if similar is not None and forced is None:
        try:
            # What training demoted here is not served from another machine's measurement either.
            config = decide(without(similar.result, demotions_of(fp.digest, kind, model)), prefer=prefer,
                            expected_steps=expected_steps, digest=fp.digest)
        except CalibrationError:
            config = None
        if config is not None:
            there = SimilarMachine(measured_at=similar.result.measured_at, differences=[
                Difference(name=name, then=then, now=now) for name, then, now in similar.differences])
            config = restate(config.model_copy(update={"source": "heuristic"}), unmeasured=why, similar=there)
    if config is None:
        fp32 = FP32_CPU
        evidence = Evidence(unmeasured=why)
        config = Decision(**fp32.model_dump(), model_kind=kind, source="heuristic", evidence=evidence,
                        reason=reason(fp32, evidence, measured_at=None), fingerprint_digest=fp.digest)
    log.warning("%s: %s", kind, config.reason)
    _decisions[memo] = (config, None)
    return config


def cached_configs(
    model_kinds: Iterable[str] | None = None, *, prefer: Prefer = "auto", expected_steps: int | None = None
) -> dict[str, Decision]:
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


def cached_families(model_kinds: Iterable[str] | None = None, *, fresh_only: bool = False) -> dict[str, FamilyResult]:
    """The stored measurements of this machine, without measuring anything.

    ``fresh_only``: leave out what the next calibration would measure again for its key or its rules, or to
    retry a transient failure (a noisy result stays).
    """
    stored = _lookup.store().load(fingerprint().digest)
    if stored is None:
        return {}
    wanted = set(model_kinds) if model_kinds is not None else None
    found = {k: v for k, v in stored.families.items() if wanted is None or k in wanted}
    if not fresh_only:
        return found
    now, registered = now_utc(), set(family_names())
    return {k: v for k, v in found.items()
            if k in registered and freshness(v, family_key(get_family(k)), now).state in ("fresh", "noisy")}


def similar_record(model_kind: str) -> _lookup.Similar | None:
    """A record of ``model_kind`` from the same hardware with other software (cache or defaults layer)."""
    store = _lookup.store()
    return _lookup.find_similar(fingerprint(), model_kind, [*store.all_files(), *_exchange.defaults_files()])


def demotions(model_kind: str) -> list[Demotion]:
    """What training runs demoted for ``model_kind`` on this machine, oldest first."""
    return _demotions.of(fingerprint().digest, model_kind)


def forget_demotion(model_kind: str) -> list[Demotion]:
    """Undo the demotions of ``model_kind`` on this machine (``--forget-demotion``); returns what was undone."""
    return _demotions.forget(fingerprint().digest, model_kind)


def forget() -> None:
    """Forget this process's decisions."""
    _decisions.clear()


__all__ = [
    "answer",
    "best_decision",
    "cached_configs",
    "cached_families",
    "decided",
    "demotions",
    "demotions_of",
    "fallback",
    "forget",
    "forget_demotion",
    "similar_record",
    "without",
]
