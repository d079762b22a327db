"""The side files: what a machine configuration keeps beside its results, one JSON document per fingerprint digest in
``<cache dir>/<room>/<digest>.json`` as ``{"schema_version": 1, <section>: {<key>: <entry>, ...}}`` (demotions,
loop summaries, max-batch and DataLoader answers), on the results files' rules (``documents``): read without
trusting it, written under a lock, read-merge-write; a file that is no such document moved aside when read; one
that cannot be read or written costs what it holds, with one warning per file and process, never an error; a change
that cannot be written holds for this process and goes with its next write. Each entry is its user's to validate,
one at a time, so one entry this version cannot read costs that entry alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from autotune._cache.documents import Document, Documents, warn_once
from autotune._wording import printable

Section = dict[str, Any]
#: a section in, the section to write out: applied under the lock to what the file holds then
Change = Callable[[Section], Section]

R = TypeVar("R", bound=BaseModel)


class SideFile(Documents):
    """One kind of side file: its ``room`` in the cache directory, the ``section`` of its document that holds the
    entries. ``what`` names one in warnings ("the demotions file"); ``lost`` says what a file that cannot be read
    costs ("best_config answers without them")."""

    def __init__(self, room: str, section: str, what: str, lost: str, schema_version: int = 1) -> None:
        super().__init__(what, lost, schema_version, room=room)
        self.section = section

    def judge(self, document: Document) -> str | None:
        if document.get("schema_version") != self.schema_version or not isinstance(document.get(self.section), dict):
            return f"not {self.what} of this version"
        return None

    def render(self, document: Document) -> Document:
        first = {} if "schema_version" in document else {"schema_version": self.schema_version}
        return {**first, **document, "schema_version": self.schema_version,
                self.section: _section(document, self.section)}

    def read(self, digest: str) -> Section:
        """The file's section with this process's unwritten changes applied; ``{}`` where the file holds nothing
        usable (one warning)."""
        document, _ = self.load(digest)
        return _section(document, self.section)

    def update(self, digest: str, change: Change, consequence: str, *, hold: bool = True) -> bool:
        """Apply ``change`` to the file's section under its lock and write the file whole. False, with one warning
        that says ``consequence``, when it cannot be written; ``hold``: the change then holds for this process and
        goes with its next write (else it is dropped)."""

        def whole(document: Document) -> Document:
            return {**document, self.section: change(_section(document, self.section))}

        return self.write(digest, whole, consequence, held=whole if hold else None) is not None

    def clear(self, root: Path | None = None) -> list[str]:
        """Delete every machine configuration's file (and those moved aside); returns the removed paths."""
        self.reset()
        return super().clear(root)


class Answers(Generic[R]):
    """One machine configuration's answers in a side file, keyed by the question they answer, each read as a
    ``model``; ``kept``: only the most recently measured are kept (their ``measured_at``). An answer that cannot
    be read or written costs a measurement."""

    def __init__(self, files: SideFile, model: type[R], digest: str, *, kept: int | None = None) -> None:
        self.files, self.model, self.digest, self.kept = files, model, digest, kept
        self.path = files.path(digest)

    def get(self, key: str) -> R | None:
        entry = self.files.read(self.digest).get(printable(key))  # the key as a read of the file gives it back
        if entry is None:
            return None
        try:
            return self.model.model_validate(entry)
        except (ValidationError, RecursionError):
            warn_once(f"{self.path}:{key}", "ignoring an unreadable answer in %s; %s", self.path, self.files.lost)
            return None

    def put(self, key: str, answer: R) -> None:
        entry = json.loads(answer.model_dump_json())
        key = printable(key)

        def change(section: Section) -> Section:
            answers = {**section, key: entry}
            if self.kept is None:
                return answers
            latest = sorted(answers, key=lambda k: _measured_at(answers[k]), reverse=True)[:self.kept]
            return {k: answers[k] for k in latest}

        self.files.update(self.digest, change, "it holds for this process only")


def _measured_at(entry: Any) -> str:
    return str(entry.get("measured_at", "")) if isinstance(entry, dict) else ""


def _section(document: Document | None, name: str) -> Section:
    section = (document or {}).get(name)
    return dict(section) if isinstance(section, dict) else {}


__all__ = ["Answers", "Change", "Section", "SideFile", "warn_once"]
