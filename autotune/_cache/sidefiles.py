"""The side files: what a machine configuration keeps beside its results, one JSON document per fingerprint digest in
``<cache dir>/<room>/<digest>.json`` as ``{"schema_version": 1, <section>: {<key>: <entry>, ...}}`` (demotions,
loop summaries, max-batch and DataLoader answers). One set of rules for all of them, the results files' (``store``):

- Read without trusting it: never through a link nor more than ``MAX_FILE_BYTES``, every string in it printable
  (``disk.load_json``); each entry is its user's to validate, one at a time, so one entry this version cannot read
  costs that entry alone.
- Written under a lock, read-merge-write, whole or not at all, in strict JSON; the other keys' entries and fields
  this version does not know are written back as they were read, so two processes that write two keys keep both.
- A file that is no such document (not JSON, too large, another shape) is ignored and moved to ``*.corrupt-<utc>``
  by the next write. One written by a newer schema, a link, anything but a regular file, or one in a directory
  other users can write is never overwritten.
- A file that cannot be read or written costs what it holds, with one warning per file and process, never an error;
  a change that cannot be written holds for this process (its reads see it) and goes with its next write.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._cache.store import default_root
from autotune._env import LOCK_TIMEOUT_S
from autotune._wording import printable

log = logging.getLogger("autotune")

Section = dict[str, Any]
#: a section in, the section to write out: applied under the lock to what the file holds then
Change = Callable[[Section], Section]
#: absent or read: write over it; aside: move it aside first; kept: never overwrite it
_State = Literal["absent", "read", "aside", "kept"]

R = TypeVar("R", bound=BaseModel)

#: changes that could not be written, per file, oldest first
_pending: dict[str, list[Change]] = {}
_warned: set[str] = set()


@dataclass(frozen=True)
class SideFile:
    """One kind of side file. ``what`` names one in warnings ("the demotions file"); ``lost`` says what a file that
    cannot be read costs ("best_config answers without them")."""

    room: str
    section: str
    what: str
    lost: str
    schema_version: int = 1

    def directory(self, root: Path | None = None) -> Path:
        return (default_root() if root is None else root) / self.room

    def path(self, digest: str, root: Path | None = None) -> Path:
        return self.directory(root) / f"{digest}.json"

    def read(self, digest: str) -> Section:
        """The file's section with this process's unwritten changes applied; ``{}`` where the file holds nothing
        usable (one warning)."""
        target = self.path(digest)
        document, _ = self._load(target)
        section = _section(document, self.section)
        for change in _pending.get(str(target), []):
            section = change(section)
        return section

    def update(self, digest: str, change: Change, consequence: str, *, hold: bool = True) -> bool:
        """Apply ``change`` to the file's section under its lock and write the file whole. False, with one warning
        that says ``consequence``, when it cannot be written; ``hold``: the change then holds for this process and
        goes with its next write (else it is dropped)."""
        target = self.path(digest)
        pending = _pending.setdefault(str(target), [])
        pending.append(change)
        written = self._write(target, pending, consequence)
        if written:
            pending.clear()
        elif not hold:
            pending.remove(change)
        if not pending:
            _pending.pop(str(target), None)
        return written

    def clear(self) -> list[str]:
        """Delete every machine configuration's file (and those moved aside); returns the removed paths."""
        self.reset()
        removed = []
        for found in sorted({*self.directory().glob("*.json"), *self.directory().glob("*.corrupt-*")}):
            try:
                found.unlink()
            except OSError:
                continue
            removed.append(str(found))
        return removed

    def reset(self) -> None:
        """Forget what this process keeps of these files: changes it could not write, warnings it gave."""
        for path in [p for p in _pending if Path(p).parent.name == self.room]:
            del _pending[path]
        _warned.difference_update({key for key in _warned if f"{os.sep}{self.room}{os.sep}" in key})

    def _write(self, target: Path, changes: list[Change], consequence: str) -> bool:
        lock = lock_file(target.parent, f"{target.name}.lock", f"{self.what} is not written; {consequence}")
        if lock is None:
            return False
        try:
            with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                document, state = self._load(target)
                if state == "kept":
                    warn_once(f"write:{target}", "%s %s is not a file autotune may replace; %s", self.what,
                               target, consequence)
                    return False
                if state == "aside":
                    aside = target.with_name(f"{target.name}.corrupt-{_disk.utc_stamp()}")
                    os.replace(target, aside)
                    log.warning("moved the unusable %s %s to %s", self.what, target, aside.name)
                    document = {}
                section = _section(document, self.section)
                for change in changes:
                    section = change(section)
                rendered = {**(document or {}), "schema_version": self.schema_version, self.section: section}
                _disk.remove_stale_temps(target)
                _disk.write_atomic(target, _disk.strict_json(rendered))
        except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
            warn_once(f"write:{target}", "cannot write %s %s (%s); %s", self.what, target, exc, consequence)
            return False
        return True

    def _load(self, target: Path) -> tuple[dict[str, Any] | None, _State]:
        """The file's document and what a write may do with the file; a warning (once) for a file it ignores."""
        problem = _disk.directory_problem(target.parent)
        if problem is not None:
            self._ignore(str(target.parent), target.parent, problem)
            return None, "kept"
        try:
            raw, _ = _disk.read_regular(target)
        except FileNotFoundError:
            return None, "absent"
        except _disk.Refused as exc:
            self._ignore(str(target), target, str(exc))
            return None, "kept"
        except OSError as exc:
            self._ignore(str(target), target, _disk.os_reason(exc))
            return None, "kept"
        document: object = None
        why = "larger than any such file" if raw is None else None
        if raw is not None:
            try:
                document = _disk.load_json(raw)
            except (ValueError, RecursionError) as exc:
                why = f"not JSON: {str(exc)[:120] or type(exc).__name__}"
        version = document.get("schema_version") if isinstance(document, dict) else None
        if isinstance(version, int) and version > self.schema_version:
            self._ignore(str(target), target, "written by a newer autotune")
            return None, "kept"
        if why is None and not (isinstance(document, dict) and isinstance(document.get(self.section), dict)
                                and version == self.schema_version):
            why = f"not {self.what} of this version"
        if why is not None or not isinstance(document, dict):
            self._ignore(str(target), target, why or "not a JSON object")
            return None, "aside"
        return document, "read"

    def _ignore(self, key: str, where: Path, why: str) -> None:
        warn_once(key, "ignoring %s %s (%s); %s", self.what, where, why, self.lost)


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


def _section(document: dict[str, Any] | None, name: str) -> Section:
    section = (document or {}).get(name)
    return dict(section) if isinstance(section, dict) else {}


def warn_once(key: str, message: str, *args: object) -> None:
    """A warning given once per process for ``key`` (a file, or one entry of it: a key that holds its path)."""
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def reset() -> None:
    """Forget what this process keeps of every side file: changes it could not write, warnings it gave."""
    _pending.clear()
    _warned.clear()


__all__ = ["Answers", "Change", "Section", "SideFile", "reset", "warn_once"]
