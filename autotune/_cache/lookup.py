"""This process's view of the cache: one :class:`Store` per cache root, the decision memo, the record of one
machine configuration (the user's cache first, then the defaults layer), and a record of the same hardware
with other software when this configuration has none."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from autotune._cache import exchange as _exchange
from autotune._cache.store import Store, StoreFile, default_root
from autotune._config import Config
from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult

# Warm-path memo: (root, digest, kind, family key parts, prefer, steps, forced, file stamp) -> (Config, good until).
# A write by another process changes the file's stamp, which is the only check a repeated call pays for besides
# the fingerprint.
decisions: dict[tuple[object, ...], tuple[Config, dt.datetime | None]] = {}
stores: dict[str, Store] = {}


def reset() -> None:
    """Forget the decision memo and the stores (their in-memory results and warnings)."""
    decisions.clear()
    stores.clear()


def store() -> Store:
    """The store of the cache root in effect now (``AUTOTUNE_CACHE_DIR``, else the user cache dir)."""
    root = default_root()
    found = stores.get(str(root))
    if found is None:
        found = stores[str(root)] = Store(root)
    return found


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


__all__ = ["Similar", "decisions", "differences", "find_similar", "known", "reset", "store", "stores"]
