"""This process's view of the cache: one :class:`Store` per cache root, the record of one machine configuration
(the user's cache first, then the defaults layer), a record of the same hardware with other software when this
configuration has none, and the cache's public tools (clear, export, import)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autotune._cache import demotions as _demotions
from autotune._cache import exchange as _exchange
from autotune._cache.documents import default_root
from autotune._cache.store import Store, StoreFile
from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult

stores: dict[str, Store] = {}


def reset() -> None:
    """Forget the stores (their in-memory results and warnings)."""
    stores.clear()


def store() -> Store:
    """The store of the cache root in effect now (``AUTOTUNE_CACHE_DIR``, else the user cache dir)."""
    root = default_root()
    found = stores.get(str(root))
    if found is None:
        found = stores[str(root)] = Store(root)
    return found


def cache_problem() -> str | None:
    """Why the cache directory in effect cannot be used, with what to do; None when it can (``Store.problem``)."""
    return store().problem()


def known(fp: Fingerprint, store: Store, kind: str) -> FamilyResult | None:
    """This machine configuration's record of ``kind``: the user's cache first, then the defaults layer."""
    stored = store.load(fp.digest)
    measured = stored.families.get(kind) if stored is not None else None
    return measured if measured is not None else _exchange.defaults_record(fp.digest, kind)


#: what a machine *is*: records that differ in any of these are not similar
_HARDWARE = ("arch", "cpu_brand", "cpu_isa", "usable_cores")
#: never worth naming as a difference
_SILENT = ("digest",)


@dataclass(frozen=True)
class Similar:
    """A record of the same hardware: its fingerprint, the family's result, and what differs, e.g.
    ``[("torch", "2.12.0", "2.13.0")]``."""

    fingerprint: Fingerprint
    result: FamilyResult
    differences: list[tuple[str, str, str]]

    def then_and_now(self) -> str:
        """e.g. ``'measured with torch 2.12.0; this is 2.13.0'``"""
        then = ", ".join(f"{name} {old}" for name, old, _ in self.differences)
        now = ", ".join(f"{name} {new}" if len(self.differences) > 1 else new for name, _, new in self.differences)
        return f"measured with {then}; this is {now}"


def _hardware(fp: Fingerprint) -> tuple[object, ...]:
    data = fp.model_dump()
    return (*(repr(data.get(name)) for name in _HARDWARE),
            tuple((a.backend, a.name) for a in fp.accelerators))


def differences(old: Fingerprint, new: Fingerprint) -> list[tuple[str, str, str]]:
    """The software fields that differ between two fingerprints of the same hardware, as (name, old, new)."""
    before, after = old.model_dump(), new.model_dump()
    found = []
    for name in after:
        if name in _HARDWARE or name in _SILENT or name == "accelerators":
            continue
        if before.get(name) != after.get(name):
            found.append((name, str(before.get(name)), str(after.get(name))))
    for a_old, a_new in zip(old.accelerators, new.accelerators, strict=True):
        if a_old.driver != a_new.driver:
            found.append((f"{a_new.name} driver", str(a_old.driver), str(a_new.driver)))
    return found


def find_similar(fp: Fingerprint, kind: str, files: Iterable[StoreFile]) -> Similar | None:
    """The most recent record of ``kind`` from another fingerprint with this hardware, or None."""
    mine = _hardware(fp)
    best: Similar | None = None
    for stored in files:
        other = stored.fingerprint
        result = stored.families.get(kind)
        if result is None or other.digest == fp.digest or _hardware(other) != mine:
            continue
        if best is None or result.measured_at > best.result.measured_at:
            best = Similar(other, result, differences(other, fp))
    return best


def clear_cache() -> list[str]:
    """Delete every stored measurement of every machine configuration (max-batch and DataLoader answers,
    demotions and training loops' summaries too); returns the removed paths."""
    # the tools' and the loops' side files, with their reports: loaded here, not for an answer from the cache
    from autotune._cache import batch_answers as _batch_answers
    from autotune._cache import loader_answers as _loader_answers
    from autotune._cache import loops as _loops

    return ([str(p) for p in store().clear()] + _batch_answers.clear() + _demotions.clear()
            + _loader_answers.clear() + _loops.clear())


def export_results(path: str | Path, model_kinds: Iterable[str] | None = None) -> int:
    """Write the stored results of every machine configuration (only ``model_kinds`` if given) to ``path``,
    each with its fingerprint, for ``import_results`` or ``AUTOTUNE_DEFAULTS`` elsewhere; returns the number
    of family records written."""
    export = _exchange.export_results(store(), Path(path).expanduser(), model_kinds)
    return sum(len(f.families) for f in export.files)


def import_results(path: str | Path) -> _exchange.ImportSummary:
    """Merge an export file into the cache as untrusted input (size cap, schema validated, nothing executed,
    everything checked before the first write); families measured here already are kept."""
    return _exchange.import_results(store(), Path(path).expanduser())


__all__ = [
    "Similar", "cache_problem", "clear_cache", "differences", "export_results", "find_similar", "import_results",
    "known", "reset", "store", "stores",
]
