"""Demotions: what training runs saw a measured candidate do on one machine configuration, in
``<cache dir>/demotions/<digest>.json`` as ``{"schema_version": 1, "demotions": {"cnn": [{...}, ...]}}``.

- Written like the results files: under a lock, read-merge-write, whole or not at all, so two processes that
  demote two families at once both keep theirs.
- Read without trusting it: never through a link nor more than ``MAX_FILE_BYTES``; each record is validated on its
  own, and one this version cannot read is ignored with a warning (and written back as it was read) while the
  others hold. A file that is no demotions file at all is ignored with a warning and moved aside by the next write.
- One file per fingerprint digest, apart from the results file: a new fingerprint starts without demotions, a
  recalibration (which writes the results) keeps them, :func:`clear` (``--clear``) removes them.
- A demotion that cannot be written holds in this process's memory, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._cache.store import default_root
from autotune._env import LOCK_TIMEOUT_S
from autotune._records import Demotion

log = logging.getLogger("autotune")

SCHEMA_VERSION = 1

#: demotions that could not be written, per (file, kind): they still hold in this process
_unsaved: dict[tuple[str, str], list[Demotion]] = {}
_warned: set[str] = set()
#: bumped by each change this process makes: part of the decision memo's key with the file's stamp
_changes = [0]


def cache_dir(root: Path | None = None) -> Path:
    return (default_root() if root is None else root) / "demotions"


def path(digest: str, root: Path | None = None) -> Path:
    return cache_dir(root) / f"{digest}.json"


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
    found = [d for d in _records(_read(path(digest)), kind, path(digest)) if d is not None]
    found += [d for d in _unsaved.get((str(path(digest)), kind), []) if d not in found]
    return sorted(found, key=lambda d: d.at)


def record(digest: str, demotion: Demotion) -> None:
    """Keep ``demotion`` for this machine configuration; it replaces an earlier one of the same device and precision."""
    target = path(digest)
    kind = demotion.model_kind
    _changes[0] += 1
    unsaved = _unsaved.setdefault((str(target), kind), [])
    unsaved[:] = [d for d in unsaved if not demotion.covers(d.candidate)] + [demotion]

    pending = list(unsaved)  # an earlier one a failed write left in memory is written with it

    def change(entries: list[Any]) -> list[Any]:
        kept = [entry for entry, found in zip(entries, _records_of(entries, kind), strict=True)
                if found is None or not any(d.covers(found.candidate) for d in pending)]
        return [*kept, *(json.loads(d.model_dump_json()) for d in pending)]

    if _write(target, kind, change, "it holds for this process only"):
        unsaved[:] = [d for d in unsaved if d not in pending]
        if not unsaved:
            del _unsaved[(str(target), kind)]


def forget(digest: str, kind: str) -> list[Demotion]:
    """Remove every demotion of ``kind`` on this machine configuration (unreadable ones too); returns the readable
    ones removed. Raises OSError when the file could not be written (they still hold there)."""
    target = path(digest)
    removed = of(digest, kind)
    _changes[0] += 1
    _unsaved.pop((str(target), kind), None)
    if (removed or target.exists()) and not _write(target, kind, lambda entries: [], "it still holds in the file"):
        raise OSError(f"could not rewrite {target}: the demotions of {kind} still hold there")
    return removed


def reset() -> None:
    """Forget what this process keeps: demotions it could not write, and which warnings it gave."""
    _unsaved.clear()
    _warned.clear()
    _changes[0] += 1


def clear() -> list[str]:
    """Delete every machine configuration's demotions; returns the removed paths."""
    _unsaved.clear()
    _changes[0] += 1
    removed = []
    for found in sorted({*cache_dir().glob("*.json"), *cache_dir().glob("*.corrupt-*")}):
        try:
            found.unlink()
        except OSError:
            continue
        removed.append(str(found))
    return removed


# -- reading ---------------------------------------------------------------------------------------------------


def _read(target: Path) -> dict[str, Any] | None:
    """The file's document (``{}`` when absent), or None when it is unusable (with one warning)."""
    problem = _disk.directory_problem(target.parent)
    if problem is not None:
        _warn_once(str(target.parent), "ignoring the demotions in %s (%s)", target.parent, problem)
        return None
    try:
        raw, _ = _disk.read_regular(target)
    except FileNotFoundError:
        return {}
    except _disk.Refused as exc:
        _warn_once(str(target), "ignoring the demotions file %s (%s)", target, exc)
        return None
    except OSError as exc:
        _warn_once(str(target), "ignoring the demotions file %s (%s)", target, _disk.os_reason(exc))
        return None
    why = "larger than any demotions file" if raw is None else None
    document: object = None
    if raw is not None:
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            why = f"not JSON: {str(exc)[:120] or type(exc).__name__}"
    if why is None and not (isinstance(document, dict) and isinstance(document.get("demotions"), dict)
                            and document.get("schema_version") == SCHEMA_VERSION):
        why = "not a demotions file of this version"
    if why is not None or not isinstance(document, dict):
        _warn_once(str(target), "ignoring the demotions file %s (%s); best_config answers without them", target, why)
        return None
    return document


def _records(document: dict[str, Any] | None, kind: str, target: Path) -> list[Demotion | None]:
    """The entries of ``kind``, each validated on its own: None for one this version cannot read (one warning)."""
    if document is None:
        return []
    entries = document.get("demotions", {}).get(kind, [])
    if not isinstance(entries, list):
        _warn_once(f"{target}:{kind}", "ignoring the demotions of %r in %s (not a list)", kind, target)
        return []
    found = _records_of(entries, kind)
    for index, (entry, demotion) in enumerate(zip(entries, found, strict=True)):
        if demotion is None:
            _warn_once(f"{target}:{kind}:{index}", "ignoring an unreadable demotion of %r in %s (%s); "
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


# -- writing ---------------------------------------------------------------------------------------------------


def _write(target: Path, kind: str, change: Callable[[list[Any]], list[Any]], consequence: str) -> bool:
    """Apply ``change`` (entries of ``kind`` -> new entries) to the file under its lock; False (one warning saying
    ``consequence``) when the file cannot be written."""
    lock = lock_file(target.parent, f"{target.name}.lock", f"changing the demotions unlocked is refused; {consequence}")
    if lock is None:
        return False
    try:
        with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
            document = _read(target)
            if document is None:  # not ours to overwrite unless it is a regular file that is no demotions file
                if _disk.directory_problem(target.parent) is not None or not target.is_file() or target.is_symlink():
                    log.warning("the demotions file %s is not a file autotune may replace; %s", target, consequence)
                    return False
                aside = target.with_name(f"{target.name}.corrupt-{_disk.utc_stamp()}")
                os.replace(target, aside)
                log.warning("moved the unusable demotions file %s to %s", target, aside.name)
                document = {}
            demotions = dict(document.get("demotions") or {})
            entries = demotions.get(kind)
            updated = change(entries if isinstance(entries, list) else [])
            if updated:
                demotions[kind] = updated
            else:
                demotions.pop(kind, None)
            rendered = {**document, "schema_version": SCHEMA_VERSION, "demotions": demotions}
            _disk.remove_stale_temps(target)
            _disk.write_atomic(target, _disk.strict_json(rendered))
    except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
        log.warning("cannot write the demotions file %s (%s); %s", target, exc, consequence)
        return False
    return True


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


__all__ = ["SCHEMA_VERSION", "cache_dir", "clear", "forget", "of", "path", "record", "reset", "stamp"]
