"""This process's view of the cache: one :class:`Store` per cache root, the decision memo, and the record of
one machine configuration (the user's cache first, then the defaults layer)."""

from __future__ import annotations

import datetime as dt

from autotune._cache import exchange as _exchange
from autotune._cache.store import Store, default_root
from autotune._config import Config
from autotune._fingerprint import Fingerprint
from autotune._models import FamilyResult

# Warm-path memo: (root, digest, kind, family key parts, prefer, steps, forced, file stamp) -> (Config, good until).
# A write by another process changes the file's stamp, which is the only check a repeated call pays for besides
# the fingerprint.
decisions: dict[tuple[object, ...], tuple[Config, dt.datetime | None]] = {}
stores: dict[str, Store] = {}


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


__all__ = ["decisions", "known", "store", "stores"]
