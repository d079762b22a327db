"""Whether stored measurements of a family still answer for it: the family's key, and failures worth retrying.

- A family's measurements hold for one :class:`FamilyKey`: its build reference, the app's ``version=``, the
  search mode, the budget and the measurement schema. Any change measures that family again; the other
  families keep serving.
- Measurements made under other rules (:func:`rules_digest`: an upgrade changed the search, its looks or
  margins, the verification) are still measurements of this machine: they serve ``best_config``, whose
  reason says so, and the next calibration measures them again, as it does a noisy one.
- A noisy result (measured while the machine was busy) is measured again by the next calibration, once: the
  re-measurement records the pick it replaced (``after_noisy``) and is kept, noisy or not, until the fingerprint,
  the rules or the family's key change. An app that calibrates at every launch on a busy machine pays for one
  more calibration, not for one at every launch.
- Failures that can be transient (``timeout``, ``crashed``, ``oom``: another app held the GPU, the machine
  was swapping) are retried by the first calibration after a cool-off of a day. ``unsupported``, ``numerics``,
  ``error`` and ``too_slow`` stay until the fingerprint or the key changes, or the user recalibrates.
- A failure of the fp32 CPU reference is never stored (:func:`reference_failure`): without it nothing could
  be verified, and a stored one would make every later call fail without measuring again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import importlib
import importlib.machinery
import json
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel

from autotune import _env
from autotune._cache import disk as _disk
from autotune._cache.documents import default_root
from autotune._families import Family
from autotune._records import (
    FP32_CPU,
    CandidateResult,
    FailureKind,
    FamilyKey,
    FamilyResult,
)
from autotune._rules import RULE_MODULES
from autotune._version import __version__
from autotune._wording import short_noise_words

#: Bumped when the meaning of stored measurements changes; part of every family's key since 3 (records without a
#: key are measured again).
MEASUREMENT_VERSION = 3
#: how long a transient failure is remembered before the next calibration tries that candidate again
RETRY_AFTER = dt.timedelta(days=1)
TRANSIENT: frozenset[FailureKind] = frozenset({"timeout", "crashed", "oom"})

def family_key(family: Family) -> FamilyKey:
    """The key of ``family`` under the current settings (reads AUTOTUNE_SEARCH and AUTOTUNE_BUDGET_S)."""
    return FamilyKey(
        reference=family.ref, version=family.version, search=_env.SEARCH.get(), budget_s=_env.BUDGET_S.get(),
        measurement_version=MEASUREMENT_VERSION,
    )


def rules_digest() -> str:
    """What this autotune measures and prunes by, as a digest (e.g. ``'5c1f0e9a2b7d4e60'``): the default
    calibration settings (the measurement's knobs, the verification window) and every public UPPER_CASE
    constant the modules of :data:`~autotune._rules.RULE_MODULES` define (the margin, the looks, the tolerances,
    a rule's own version). Derived from them, never maintained by hand, so a changed or added constant cannot be
    forgotten.

    A process that has not loaded those modules (``best_config`` answering from the cache) reads the digest the
    last one that did remembered for these very files, so the calibration machinery loads on a miss only."""
    if all(sys.modules.get(name) is not None for name in (*RULE_MODULES, _SETTINGS)):
        digest = _digest()  # their values now, whatever changed them in this process
    else:
        remembered = _remembered(_files_stamp())
        if remembered is not None:
            return remembered
        digest = _digest()
    _remember(digest)
    return digest


#: the module whose ``CalibrationSettings`` defaults the digest reads
_SETTINGS = "autotune._lab.protocol"


def _digest() -> str:
    constants = {
        f"{name}.{constant}": value
        for name in RULE_MODULES
        for constant, value in vars(importlib.import_module(name)).items()
        if constant.isupper() and not constant.startswith("_") and not callable(value)
        and not isinstance(value, (types.ModuleType, TypeVar))
    }
    settings = importlib.import_module(_SETTINGS).CalibrationSettings()
    rules = {"settings": settings.model_dump(mode="json"), "constants": constants}
    canonical = json.dumps(rules, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _files_stamp() -> str:
    """What changes when any rule module's file does (its path, time and size), for this Python and autotune. In a
    frozen app the modules are inside the app's executable, whose own file then stands for them."""
    parts: list[object] = [sys.version, __version__]
    for name in (*RULE_MODULES, _SETTINGS):
        spec = _spec(name)
        origin = spec.origin if spec is not None else None
        if origin is not None and not os.path.isfile(origin):
            origin = sys.executable
        st = os.stat(origin) if origin is not None else None
        parts.append((name, origin, st.st_mtime_ns if st else None, st.st_size if st else None))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` would load from, found as the import system finds it but without importing its
    packages (``importlib.util.find_spec`` imports them): reading the stamp loads none of the calibration."""
    package, _, _ = name.rpartition(".")
    path = None
    if package:
        loaded = sys.modules.get(package)
        outer = _spec(package) if loaded is None else None
        path = loaded.__path__ if loaded is not None else outer.submodule_search_locations if outer else None
        if path is None:
            return None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if isinstance(spec, importlib.machinery.ModuleSpec):
            return spec
    return None


def _remembered(files: str) -> str | None:
    """The digest remembered for ``files`` in the cache directory, if any (``<cache>/rules.digest``)."""
    with contextlib.suppress(OSError, _disk.Refused, UnicodeDecodeError, ValueError):
        data, _ = _disk.read_regular(default_root() / _REMEMBERED)
        stamp, digest = (data or b"").decode().split()
        return digest if stamp == files else None
    return None


def _remember(digest: str) -> None:
    """Keep ``digest`` for the rule modules' files, once per process and cache directory; a directory that cannot
    take it only costs the next process the modules' import."""
    root = default_root()
    if (root, digest) in _remembered_here:
        return
    _remembered_here.add((root, digest))
    files = _files_stamp()
    if _remembered(files) == digest:
        return
    with contextlib.suppress(OSError):
        if _disk.directory_problem(root, create=True) is None:
            _disk.write_atomic(root / _REMEMBERED, f"{files} {digest}\n".encode())


_remembered_here: set[tuple[Path, str]] = set()
_REMEMBERED = "rules.digest"


def reset() -> None:
    """Forget which cache directories this process gave the rules digest to: the next call writes it again."""
    _remembered_here.clear()


def _plain(value: object) -> object:
    """A rule constant JSON cannot write as it is, as plain data; TypeError for anything without a stable form."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(item, sort_keys=True, default=_plain) for item in value)
    if type(value).__module__ == "torch":  # a dtype, a memory format: named by their str
        return str(value)
    raise TypeError(f"a rule constant of type {type(value).__name__} has no stable form to digest")


def retry_at(measured: FamilyResult, result: CandidateResult) -> dt.datetime | None:
    """When the next calibration tries this failed candidate again; None when it is not retried by itself."""
    if result.failure is None or result.failure.kind not in TRANSIENT:
        return None
    return _parse(measured.measured_at) + RETRY_AFTER


State = Literal["fresh", "noisy", "older_rules", "retry", "other_key"]


@dataclass(frozen=True)
class Freshness:
    """Whether a stored result still answers for its family, and what measures it again, e.g.
    ``Freshness("retry", "retrying cuda:0 fp16-mixed (oom)")``.

    ``other_key``: measured for another build, ``version=``, search or budget: it no longer answers.
    ``retry``: a transient failure's cool-off is over: it answers where measuring is not allowed.
    ``older_rules``, ``noisy``: it answers (its reason says so) until the next calibration measures it again.
    ``fresh``: it answers, and a calibration keeps it (a noisy re-measurement of a noisy result too).
    """

    state: State
    why: str | None = None

    @property
    def answers(self) -> bool:
        """``best_config`` may answer from it."""
        return self.state != "other_key"

    @property
    def measure_first(self) -> bool:
        """``best_config`` measures before answering, where it may measure."""
        return self.state in ("other_key", "retry")

    @property
    def final(self) -> bool:
        """A calibration keeps it (unless forced)."""
        return self.state == "fresh"


def freshness(measured: FamilyResult, key: FamilyKey, now: dt.datetime) -> Freshness:
    """The one verdict on a stored result of ``key``'s family at ``now`` (see :class:`Freshness`)."""
    if measured.key is None:
        return Freshness("other_key", "it was measured by an older autotune that did not record what for")
    if measured.key != key:
        changed = [f"{name} {getattr(measured.key, name)!r} -> {getattr(key, name)!r}"
                   for name in FamilyKey.model_fields if getattr(measured.key, name) != getattr(key, name)]
        return Freshness("other_key", "it was measured for another " + ", ".join(changed))
    due = [r for r in measured.candidates if (at := retry_at(measured, r)) is not None and at <= now]
    if due:
        return Freshness("retry", "retrying " + ", ".join(f"{r.candidate.label} ({r.failure.kind})"
                                                            for r in due if r.failure))
    changed_rules = rules_change(measured)
    if changed_rules is not None:
        return Freshness("older_rules", changed_rules)
    if measured.noisy and measured.after_noisy is None:
        return Freshness("noisy", "it was measured " + short_noise_words(measured.noisy_because, measured.loads))
    return Freshness("fresh")


def rules_change(measured: FamilyResult) -> str | None:
    """Why ``measured`` no longer follows this autotune's rules, e.g. "it was measured under older rules (by
    autotune 0.1.0)"; None when it does."""
    if measured.rules == rules_digest():
        return None
    return f"it was measured under older rules (by autotune {measured.autotune_version})"


def fresh_until(measured: FamilyResult) -> dt.datetime | None:
    """The earliest moment a transient failure of ``measured`` becomes due for a retry; None when none is."""
    times = [at for r in measured.candidates if (at := retry_at(measured, r)) is not None]
    return min(times, default=None)


def reference_failure(measured: FamilyResult) -> CandidateResult | None:
    """The fp32 CPU reference's result when it failed: such a calibration is raised, never stored."""
    reference = measured.result(FP32_CPU)
    return reference if reference is not None and reference.failure is not None else None


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _parse(stamp: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(stamp)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.timezone.utc)


__all__ = [
    "MEASUREMENT_VERSION",
    "RETRY_AFTER",
    "TRANSIENT",
    "Freshness",
    "State",
    "family_key",
    "fresh_until",
    "freshness",
    "now_utc",
    "reference_failure",
    "reset",
    "retry_at",
    "rules_change",
    "rules_digest",
]
