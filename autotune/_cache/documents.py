"""The rules of the cache's JSON documents, one per fingerprint digest: the results files (``store``) and the side
files beside them (``sidefiles``).

- Read without trusting it: never through a link nor more than ``MAX_FILE_BYTES``, every string in it printable
  (``disk.load_json``); its kind judges the whole (:meth:`Documents.judge`), its users each entry.
- Written under the file's lock (``locks.lock_file``), read-merge-write, whole or not at all, in strict JSON; what
  this version does not know is written back as it was read, so two processes that write two entries keep both.
- A file that is no such document (not JSON, too large, another shape, an older schema) is moved to
  ``*.corrupt-<utc>`` when it is read, under the lock, unless another process replaced it meanwhile (then that one
  is judged). One written by a newer schema, a link, anything but a regular file, one that cannot be read, or one
  in a directory other users can write is never overwritten.
- A file that cannot be read or written costs what it holds, with one warning per file and process, never an error;
  a change that cannot be written holds for this process (its reads see it) and goes with its next write.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._env import CACHE_DIR, LOCK_TIMEOUT_S

log = logging.getLogger("autotune")

Document = dict[str, Any]
#: a document in (``{}`` where the file holds none), the document to write out: applied under the file's lock
Change = Callable[[Document], Document]
#: absent or read: write over it; kept: never overwrite it
_State = Literal["absent", "read", "kept"]

#: changes that could not be written, per file, oldest first
_pending: dict[str, list[Change]] = {}
_warned: set[str] = set()


def default_root() -> Path:
    """``AUTOTUNE_CACHE_DIR``, else the platform's user cache dir (e.g. ``~/.cache/autotune``)."""
    configured = CACHE_DIR.get()
    if configured is not None:
        return configured
    import platformdirs

    return Path(platformdirs.user_cache_dir("autotune", appauthor=False))


class Documents(abc.ABC):
    """One kind of document, in ``<cache dir>/<room>/<digest>.json``. ``what`` names one in warnings ("the
    demotions file"); ``lost`` says what one that cannot be read costs ("best_config answers without them")."""

    def __init__(self, what: str, lost: str, schema_version: int, *, room: str = "") -> None:
        self.what, self.lost, self.schema_version, self.room = what, lost, schema_version, room

    @abc.abstractmethod
    def judge(self, document: Document) -> str | None:
        """Why ``document`` (a JSON object of no newer schema) is not one of these, e.g. ``"schema 0, expected 1"``;
        None when it is."""

    @abc.abstractmethod
    def render(self, document: Document) -> Document:
        """``document`` as it is written: this schema's fields in their order, what this version does not know as
        read."""

    def directory(self, root: Path | None = None) -> Path:
        return (default_root() if root is None else root) / self.room

    def path(self, digest: str, root: Path | None = None) -> Path:
        return self.directory(root) / f"{digest}.json"

    def load(self, digest: str, root: Path | None = None) -> tuple[Document | None, bool]:
        """The document with this process's unwritten changes applied (None where there is neither), and whether
        the file held one; one warning for a file it cannot use."""
        target = self.path(digest, root)
        document, state = self._read(target)
        held = _pending.get(str(target), [])
        if not held:
            return document, state == "read"
        merged = {} if document is None else document
        for change in held:
            merged = change(merged)
        return self.render(merged), state == "read"

    def write(self, digest: str, change: Change, consequence: str, *, held: Change | None,
              root: Path | None = None) -> Document | None:
        """Apply this process's unwritten changes, then ``change``, to the file's document under its lock, and
        write it whole: the document written. None, with one warning that says ``consequence``, when it cannot be
        written: ``held`` then holds for this process and goes with its next write (None: nothing holds)."""
        target = self.path(digest, root)
        written = self._write(target, [*_pending.get(str(target), []), change], consequence)
        if written is not None:
            _pending.pop(str(target), None)
        elif held is not None:
            _pending.setdefault(str(target), []).append(held)
        return written

    def held(self, root: Path | None = None) -> list[tuple[str, int]]:
        """(digest, changes) of each file under ``root`` with changes this process could not write."""
        directory = self.directory(root)
        return sorted((Path(key).stem, len(changes)) for key, changes in list(_pending.items())  # a thread may add one
                      if Path(key).parent == directory)

    def clear(self, root: Path | None = None) -> list[str]:
        """Delete every file of this kind under ``root`` (and those moved aside), with this process's unwritten
        changes to them; returns the removed paths."""
        directory = self.directory(root)
        for key in [key for key in _pending if Path(key).parent == directory]:
            del _pending[key]
        removed = []
        for found in sorted({*directory.glob("*.json"), *directory.glob("*.corrupt-*")}):
            with contextlib.suppress(OSError):
                found.unlink()
                removed.append(str(found))
        return removed

    def reset(self) -> None:
        """Forget what this process keeps of files of this kind, in any cache directory: changes it could not
        write, warnings it gave."""
        part = f"{os.sep}{self.room}{os.sep}"
        for key in [key for key in _pending if part in key]:
            del _pending[key]
        _warned.difference_update({key for key in _warned if part in key})

    def _write(self, target: Path, changes: list[Change], consequence: str) -> Document | None:
        lock = lock_file(target.parent, f"{target.name}.lock", f"cannot write {self.what} {target}; {consequence}")
        if lock is None:
            return None
        try:
            with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                document, state = self._read(target, locked=True)
                if state == "kept":
                    warn_once(f"{target}:write", "%s %s is not a file autotune may replace; %s", self.what, target,
                              consequence)
                    return None
                merged = {} if document is None else document
                for change in changes:
                    merged = change(merged)
                rendered = self.render(merged)
                _disk.remove_stale_temps(target)
                _disk.write_atomic(target, _disk.strict_json(rendered))
        except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
            warn_once(f"{target}:write", "cannot write %s %s (%s); %s", self.what, target, _disk.os_reason(exc),
                      consequence)
            return None
        return rendered

    def _read(self, target: Path, *, locked: bool = False) -> tuple[Document | None, _State]:
        """The file's document and what a write may do with the file. One that is no such document is moved aside
        (``locked``: its lock is held already)."""
        problem = _disk.directory_problem(target.parent)
        if problem is not None:
            self._unread(str(target.parent), target, _disk.unusable_directory(target.parent) or problem)
            return None, "kept"
        try:
            raw, found = _disk.read_regular(target)
        except FileNotFoundError:
            return None, "absent"
        except _disk.Refused as exc:
            self._unread(str(target), target, str(exc))
            return None, "kept"
        except OSError as exc:
            self._unread(str(target), target, _disk.os_reason(exc))
            return None, "kept"
        document: object = None
        if raw is None:
            why: str | None = f"{found[2] / 2**20:.0f} MB, larger than any such file"
        else:
            try:
                document = _disk.load_json(raw)
            except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
                why = f"not JSON: {str(exc)[:120] or type(exc).__name__}"
            else:
                why = None if isinstance(document, dict) else f"a JSON {type(document).__name__}, not an object"
        if isinstance(document, dict):
            version = document.get("schema_version")
            if isinstance(version, int) and not isinstance(version, bool) and version > self.schema_version:
                self._unread(str(target), target, f"written by a newer autotune (schema {version} > "
                                                  f"{self.schema_version})")
                return None, "kept"
            why = self.judge(document)
            if why is None:
                return document, "read"
        return self._move_aside(target, found, why or "not a JSON object", locked=locked)

    def _move_aside(self, target: Path, found: tuple[int, ...], why: str, *, locked: bool
                    ) -> tuple[Document | None, _State]:
        lock = None if locked else lock_file(target.parent, f"{target.name}.lock",
                                             f"{self.what} {target} is not moved aside; {self.lost}")
        if lock is None and not locked:
            return None, "kept"
        aside = target.with_name(f"{target.name}.corrupt-{_disk.utc_stamp()}")
        try:
            with contextlib.nullcontext() if lock is None else lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                # Another process may have replaced the file since it was read: move only what was judged, and judge
                # the new one instead (writing over it as if absent would lose that process's entries).
                if _disk.identity(os.lstat(target)) != found:
                    return self._read(target, locked=True)
                os.replace(target, aside)
        except FileNotFoundError:
            return None, "absent"
        except (OSError, TimeoutError) as exc:
            warn_once(f"{target}:aside", "%s %s is corrupt (%s) and could not be moved aside (%s); %s", self.what,
                      target, why, _disk.os_reason(exc), self.lost)
            return None, "kept"
        log.warning("%s %s was corrupt (%s); moved to %s; %s", self.what, target, why, aside.name, self.lost)
        return None, "absent"

    def _unread(self, key: str, target: Path, why: str) -> None:
        warn_once(key, "cannot read %s %s (%s); %s", self.what, target, why, self.lost)


def warn_once(key: str, message: str, *args: object) -> None:
    """A warning given once per process for ``key`` (a file, or one entry of it: a key that holds its path)."""
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def reset() -> None:
    """Forget what this process keeps of every document: changes it could not write, warnings it gave."""
    _pending.clear()
    _warned.clear()


__all__ = ["Change", "Document", "Documents", "default_root", "reset", "warn_once"]
