"""What training loops saw of their time (``guard.data``): per machine configuration in
``<cache dir>/loops/<digest>.json`` as ``{"schema_version": 1, "loops": {"cnn": [{...}, ...]}}``, latest first.

- ``KEPT_PER_FAMILY`` runs per family; a run updates its own entry (the same ``started_at``) at each epoch's end.
- Written like the demotions: under a lock, read-merge-write, whole or not at all; another family's entries are
  written back as they were read.
- Read without trusting it: never through a link nor more than ``MAX_FILE_BYTES``; an entry this version cannot
  read is left out. A file that cannot be read or written costs the observation, with one warning, never an error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._cache.store import default_root
from autotune._env import LOCK_TIMEOUT_S
from autotune._records import LoopSummary

log = logging.getLogger("autotune")

SCHEMA_VERSION = 1
#: the latest runs kept per family: what --explain shows beside the measured step
KEPT_PER_FAMILY = 5

_warned: set[str] = set()


def cache_dir() -> Path:
    return default_root() / "loops"


def path(digest: str) -> Path:
    return cache_dir() / f"{digest}.json"


def of(digest: str, kind: str) -> list[LoopSummary]:
    """The runs of ``kind`` kept for this machine configuration, latest first."""
    document = _read(path(digest))
    found = []
    for entry in (document or {}).get("loops", {}).get(kind, []):
        try:
            summary = LoopSummary.model_validate(entry)
        except (ValidationError, RecursionError):
            continue
        if summary.model_kind == kind:
            found.append(summary)
    return found


def record(digest: str, summary: LoopSummary) -> None:
    """Keep ``summary`` first among its family's runs; it replaces the entry of the same run."""
    target = path(digest)
    lock = lock_file(target.parent, f"{target.name}.lock", "the training loop's summary is not kept")
    if lock is None:
        return
    try:
        with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
            document = _read(target)
            if document is None:
                return
            loops = dict(document.get("loops") or {})
            earlier = loops.get(summary.model_kind)
            others = [entry for entry in (earlier if isinstance(earlier, list) else [])
                      if not (isinstance(entry, dict) and entry.get("started_at") == summary.started_at)]
            loops[summary.model_kind] = [summary.model_dump(mode="json"), *others][:KEPT_PER_FAMILY]
            _disk.remove_stale_temps(target)
            _disk.write_atomic(target, _disk.strict_json({**document, "schema_version": SCHEMA_VERSION,
                                                          "loops": loops}))
    except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
        _warn_once(str(target), "cannot keep the training loop's summary in %s (%s)", target, exc)


def clear() -> list[str]:
    """Delete every machine configuration's loop summaries; returns the removed paths."""
    removed = []
    for found in sorted(cache_dir().glob("*.json")):
        try:
            found.unlink()
        except OSError:
            continue
        removed.append(str(found))
    return removed


def _read(target: Path) -> dict[str, Any] | None:
    """The file's document (``{}`` when absent or not a loop summaries file, which the next write replaces), or
    None when it must be left alone (a link, another user's directory, unreadable, a newer schema), with one
    warning."""
    problem = _disk.directory_problem(target.parent)
    if problem is not None:
        _warn_once(str(target.parent), "ignoring the loop summaries in %s (%s)", target.parent, problem)
        return None
    try:
        raw, _ = _disk.read_regular(target)
    except FileNotFoundError:
        return {}
    except _disk.Refused as exc:
        _warn_once(str(target), "ignoring the loop summaries file %s (%s)", target, exc)
        return None
    except OSError as exc:
        _warn_once(str(target), "ignoring the loop summaries file %s (%s)", target, _disk.os_reason(exc))
        return None
    try:
        document = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict) and isinstance(document.get("schema_version"), int) \
            and document["schema_version"] > SCHEMA_VERSION:
        _warn_once(str(target), "ignoring the loop summaries file %s (written by a newer autotune)", target)
        return None
    if not (isinstance(document, dict) and isinstance(document.get("loops"), dict)
            and document.get("schema_version") == SCHEMA_VERSION):
        _warn_once(str(target), "the loop summaries file %s is not one this version reads; starting it afresh",
                   target)
        return {}
    return document


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


__all__ = ["KEPT_PER_FAMILY", "SCHEMA_VERSION", "cache_dir", "clear", "of", "path", "record"]
