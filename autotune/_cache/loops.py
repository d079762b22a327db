"""What training loops saw of their time (``guard.data``): per machine configuration in
``<cache dir>/loops/<digest>.json`` as ``{"schema_version": 1, "loops": {"cnn": [{...}, ...]}}``, latest first.

- ``KEPT_PER_FAMILY`` runs per family; a run updates its own entry (the same ``started_at``) at each epoch's end.
- A side file (``sidefiles``): read without trusting it, written under a lock, read-merge-write; another family's
  entries are written back as they were read, and an entry this version cannot read is left out. A file that
  cannot be read or written costs the observation, with one warning, never an error.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from autotune._cache.sidefiles import Section, SideFile
from autotune._reports import LoopSummary

SCHEMA_VERSION = 1
FILES = SideFile("loops", "loops", "the loop summaries file", "the training loops' summaries are not shown",
                 SCHEMA_VERSION)
#: the latest runs kept per family: what --explain shows beside the measured step
KEPT_PER_FAMILY = 5


def path(digest: str) -> Path:
    return FILES.path(digest)


def of(digest: str, kind: str) -> list[LoopSummary]:
    """The runs of ``kind`` kept for this machine configuration, latest first."""
    entries = FILES.read(digest).get(kind)
    found = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            summary = LoopSummary.model_validate(entry)
        except (ValidationError, RecursionError):
            continue
        if summary.model_kind == kind:
            found.append(summary)
    return found


def record(digest: str, summary: LoopSummary) -> None:
    """Keep ``summary`` first among its family's runs; it replaces the entry of the same run."""

    def change(section: Section) -> Section:
        earlier = section.get(summary.model_kind)
        others = [entry for entry in (earlier if isinstance(earlier, list) else [])
                  if not (isinstance(entry, dict) and entry.get("started_at") == summary.started_at)]
        return {**section, summary.model_kind: [summary.model_dump(mode="json"), *others][:KEPT_PER_FAMILY]}

    FILES.update(digest, change, "the training loop's summary is kept for this process only")


def clear() -> list[str]:
    """Delete every machine configuration's loop summaries; returns the removed paths."""
    return FILES.clear()


__all__ = ["FILES", "KEPT_PER_FAMILY", "SCHEMA_VERSION", "clear", "of", "path", "record"]
