"""Measurements on disk: one JSON file per fingerprint digest, on the cache's document rules (``documents``).

- A write re-reads the file under its lock, merges, and replaces it whole, so two processes that calibrate
  different families never lose each other's results and a crash mid-write never leaves a torn file.
- Each family is validated on its own (``schema``). A family this version cannot read is set aside with a
  WARNING and measured again, while the other families keep serving; when its new measurement is saved, the old
  record is moved to ``<file>.<family>.corrupt-<utc>``. Everything else in the file, fields this version does
  not know included, is written back as it was read.
- A file that is not a results file at all (not JSON, truncated, too large, wrong types at the top) is moved to
  ``*.corrupt-<utc>`` when read, and its families are measured again. A file written by a newer schema, one that
  cannot be read, a symbolic link, anything but a regular file, or one in a directory other users can write is
  never overwritten.
- A family that cannot be written (a disk read-only, full, locked) holds for this process and goes with its next
  write, unless the file holds a newer measurement of it by then.
- Pruning by last use, and the file-safety rules themselves, live in ``disk``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from autotune._cache import disk as _disk
from autotune._cache import schema
from autotune._cache.disk import KEEP_FILES, KEEP_QUARANTINED, KEEP_USED_DAYS, write_atomic
from autotune._cache.documents import Document, Documents, warn_once
from autotune._cache.locks import lock_file
from autotune._cache.schema import SCHEMA_VERSION, StoreFile
from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("autotune")

#: the last-use marker is rewritten at most this often per process
_MARK_EVERY_S = 3600.0
#: what a family that cannot be written does meanwhile
_HELD = "keeping results in memory for this process"


class _ResultsFiles(Documents):
    """The results files: judged and rendered by ``schema``."""

    def judge(self, document: Document) -> str | None:
        return schema.judge(document)

    def render(self, document: Document) -> Document:
        return schema.render(document)


FILES = _ResultsFiles("the results file", "its families are measured again when next asked for", SCHEMA_VERSION)


class Store:
    """The results files under ``root``; a family that cannot be written is served from this process's memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._marked: dict[str, float] = {}
        #: this process's saves and clears: a write that leaves the file's time and size alike, or never reaches
        #: the disk, still changes :meth:`stamp`
        self._writes = 0

    def path(self, digest: str) -> Path:
        return FILES.path(digest, self.root)

    def stamp(self, digest: str) -> tuple[int, ...]:
        """This process's writes, then the file's (mtime_ns, size): changes whenever what ``load`` returns may have,
        cheaply (a memo key)."""
        try:
            st = os.stat(self.path(digest))
        except OSError:
            return (self._writes,)
        return self._writes, st.st_mtime_ns, st.st_size

    def load(self, digest: str) -> StoreFile | None:
        """The results for ``digest``: from disk, with the families only this process's memory holds, else None."""
        stored, on_disk = self._stored(digest)
        if on_disk:
            self._mark_used(digest)
        return stored

    def _stored(self, digest: str) -> tuple[StoreFile | None, bool]:
        document, on_disk = FILES.load(digest, self.root)
        if document is None:
            return None, on_disk
        stored, invalid = schema.families(document)
        for name, problem in invalid.items():
            warn_once(f"{self.path(digest)}:{name}", "results of %r in %s cannot be used (%s); %r is measured again "
                      "when next asked for (they are set aside then); the other families are kept", name,
                      self.path(digest), problem, name)
        return stored, on_disk

    def save(self, fingerprint: Fingerprint, result: FamilyResult) -> StoreFile:
        """Merge ``result`` into the file for this fingerprint, under the lock; returns what is now stored."""
        digest, path = fingerprint.digest, self.path(fingerprint.digest)
        self._writes += 1

        def put(document: Document) -> Document:
            _set_aside(path, result.model_kind, document)
            return schema.put(document, fingerprint, result)

        def held(document: Document) -> Document:
            return document if schema.holds_newer(document, result) else schema.put(document, fingerprint, result)

        document = FILES.write(digest, put, _HELD, held=held, root=self.root)
        if document is not None:
            self._mark_used(digest, now=True)
            _disk.prune(self.root)
        else:
            document, _ = FILES.load(digest, self.root)
            assert document is not None, "the family that could not be written holds"
        return schema.families(document)[0]

    def stamps(self) -> tuple[object, ...]:
        """This process's writes, (name, mtime_ns, size) of every results file, then the files with changes only this
        process's memory holds: changes when any of them does (memo keys)."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(".json"):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        found.append((entry.name, st.st_mtime_ns, st.st_size))
        return (self._writes, *sorted(found), *((digest, changes, 0) for digest, changes in FILES.held(self.root)))

    def all_files(self) -> list[StoreFile]:
        """Every readable results file under ``root`` (every machine configuration), with what only this process's
        memory holds: for export and similar-machine answers."""
        digests = {digest for digest, _ in FILES.held(self.root)}
        if _disk.directory_problem(self.root) is None:
            with contextlib.suppress(OSError):
                digests.update(path.stem for path in self.root.glob("*.json"))
        found: dict[str, StoreFile] = {}
        for digest in sorted(digests):
            stored, _ = self._stored(digest)
            if stored is not None:
                found.setdefault(stored.fingerprint.digest, stored)
        return list(found.values())

    def clear(self) -> list[Path]:
        """Delete every results file (quarantined ones and last-use markers too); returns what was removed."""
        self._writes += 1
        removed = [Path(path) for path in FILES.clear(self.root)]
        for path in sorted(self.root.glob("*.used")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        return sorted(removed)

    # -- locks, directory, pruning -------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the cache directory cannot be used, with what to do (``_disk.unusable_directory``); None when it
        can. Creates it where missing."""
        return _disk.unusable_directory(self.root)

    def calibration_lock(self, digest: str, model_kind: str, *,
                         unlocked: str = "calibrating without waiting for other processes"
                         ) -> filelock.BaseFileLock | None:
        """Held while one process calibrates one family, so others wait for its result (single flight).

        None when the directory cannot hold a lock (unwritable, refused), with one warning saying what happens
        then (``unlocked``; by default: the family is calibrated unlocked).
        """
        return lock_file(self.root, f"{digest}.{model_kind}.calibrating.lock", unlocked)

    def _mark_used(self, digest: str, *, now: bool = False) -> None:
        """Record this use of the file for pruning (at most hourly per process unless ``now``)."""
        at = time.time()
        if not now and at - self._marked.get(digest, -math.inf) < _MARK_EVERY_S:
            return
        self._marked[digest] = at
        _disk.mark_used(self.path(digest), at)


def _set_aside(path: Path, family: str, document: Document) -> None:
    """Keep the unreadable record of ``family`` next to the file before its new measurement replaces it."""
    families = document.get("families") or {}
    if family not in families:
        return
    _, why = schema.validate_family(family, families[family])
    if why is None:
        return
    target = path.with_name(f"{path.name}.{family}.corrupt-{_disk.utc_stamp()}")
    write_atomic(target, _disk.strict_json({"family": family, "reason": why, "record": families[family]}))
    log.warning("moved the unusable results of %r to %s", family, target.name)


__all__ = ["FILES", "KEEP_FILES", "KEEP_QUARANTINED", "KEEP_USED_DAYS", "SCHEMA_VERSION", "Store", "StoreFile",
           "write_atomic"]
