"""Demotions: what training runs saw a measured candidate do on one machine configuration, in
``<cache dir>/demotions/<digest>.json`` as ``{"schema_version": 1, "demotions": {"cnn": [{...}, ...]}}``.

- A side file (``sidefiles``): read without trusting it, written under a lock, read-merge-write, so two processes
  that demote two families at once both keep theirs; a demotion that cannot be written holds in this process.
- Each record is validated on its own: one this version cannot read is ignored with a warning (and written back
  as it was read) while the others hold.
- One file per fingerprint digest, apart from the results file: a new fingerprint starts without demotions, a
  recalibration (which writes the results) keeps them, :func:`clear` (``--clear``) removes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune._cache.sidefiles import Section, SideFile, warn_once
from autotune._records import Demotion

SCHEMA_VERSION = 1
FILES = SideFile("demotions", "demotions", "the demotions file", "best_config answers without them", SCHEMA_VERSION)

#: bumped by each change this process makes: part of the decision memo's key with the file's stamp
_changes = [0]


def path(digest: str, root: Path | None = None) -> Path:
    return FILES.path(digest, root)


def stamp(digest: str, root: Path | None = None) -> tuple[int, ...]:
    """Changes whenever this machine configuration's demotions may have: this process's changes, then the file's
    (mtime_ns, size). ``root``: the cache directory, where the caller has it (best_config's warm path does)."""
    try:
        st = os.stat(path(digest, root))
    except OSError:
        return (_changes[0],)
    return _changes[0], st.st_mtime_ns, st.st_size


def of(digest: str, kind: str) -> list[Demotion]:
    """The readable demotions of ``kind`` on this machine configuration, oldest first."""
    found = [d for d in _records(FILES.read(digest), kind, path(digest)) if d is not None]
    return sorted(found, key=lambda d: d.at)


def record(digest: str, demotion: Demotion) -> None:
    """Keep ``demotion`` for this machine configuration; it replaces an earlier one of the same device and precision."""
    kind = demotion.model_kind
    _changes[0] += 1

    def change(section: Section) -> Section:
        entries = _entries(section, kind)
        kept = [entry for entry, found in zip(entries, _records_of(entries, kind), strict=True)
                if found is None or not demotion.covers(found.candidate)]
        return {**section, kind: [*kept, json.loads(demotion.model_dump_json())]}

    FILES.update(digest, change, "it holds for this process only")


def forget(digest: str, kind: str) -> list[Demotion]:
    """Remove every demotion of ``kind`` on this machine configuration (unreadable ones too); returns the readable
    ones removed. Raises OSError when the file could not be written (they still hold there)."""
    removed = of(digest, kind)
    _changes[0] += 1

    def change(section: Section) -> Section:
        return {name: entries for name, entries in section.items() if name != kind}

    if (removed or path(digest).exists()) and not FILES.update(digest, change, "it still holds in the file",
                                                                hold=False):
        raise OSError(f"could not rewrite {path(digest)}: the demotions of {kind} still hold there")
    return removed


def reset() -> None:
    """Forget what this process keeps: demotions it could not write, and which warnings it gave."""
    FILES.reset()
    _changes[0] += 1


def clear() -> list[str]:
    """Delete every machine configuration's demotions; returns the removed paths."""
    _changes[0] += 1
    return FILES.clear()


def _entries(section: Section, kind: str) -> list[Any]:
    entries = section.get(kind, [])
    return entries if isinstance(entries, list) else []


def _records(section: Section, kind: str, target: Path) -> list[Demotion | None]:
    """The entries of ``kind``, each validated on its own: None for one this version cannot read (one warning)."""
    if not isinstance(section.get(kind, []), list):
        warn_once(f"{target}:{kind}", "ignoring the demotions of %r in %s (not a list)", kind, target)
        return []
    entries = _entries(section, kind)
    found = _records_of(entries, kind)
    for index, (entry, demotion) in enumerate(zip(entries, found, strict=True)):
        if demotion is None:
            warn_once(f"{target}:{kind}:{index}", "ignoring an unreadable demotion of %r in %s (%s); "
                      "python -m autotune --forget-demotion %s removes it", kind, target, _problem(entry, kind), kind)
    return found


def _records_of(entries: list[Any], kind: str) -> list[Demotion | None]:
    found: list[Demotion | None] = []
    for entry in entries:
        try:
            demotion: Demotion | None = Demotion.model_validate(entry)
        except (ValidationError, RecursionError):
            demotion = None
        found.append(demotion if demotion is not None and demotion.model_kind == kind else None)
    return found


def _problem(entry: Any, kind: str) -> str:
    try:
        demotion = Demotion.model_validate(entry)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'the record'}: {first['msg']}"[:200]
    except RecursionError:
        return "nested too deeply"
    return f"it is a demotion of {demotion.model_kind!r}"


__all__ = ["FILES", "SCHEMA_VERSION", "clear", "forget", "of", "path", "record", "reset", "stamp"]
