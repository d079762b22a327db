"""Measurements on disk: one JSON file per fingerprint digest, merged under a lock, read defensively.

- A write re-reads the file under a file lock, merges, and replaces it atomically (``_disk.write_atomic``), so
  two processes that calibrate different families never lose each other's results and a crash mid-write never
  leaves a torn file.
- Each family is validated on its own (``records``). A family this version cannot read is set aside with a
  WARNING and measured again, while the other families keep serving; when its new measurement is saved, the old
  record is moved to ``<file>.<family>.corrupt-<utc>``. Everything else in the file, fields this version does
  not know included, is written back as it was read.
- A file that is not a results file at all (not JSON, truncated, too large, wrong types at the top) is renamed
  to ``*.corrupt-<utc>`` and its families are measured again. A file written by a newer schema, a file that
  cannot be read, a symbolic link, or anything but a regular file is never overwritten: results stay in
  memory for this process. So does a results directory that other users can write.
- A disk that cannot be written (read-only, full, locked) degrades to an in-memory store for this process.
- Pruning by last use, and the file-safety rules themselves, live in ``disk``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotune._cache import disk as _disk
from autotune._cache.disk import KEEP_FILES, KEEP_QUARANTINED, KEEP_USED_DAYS, write_atomic
from autotune._cache.locks import lock_file
from autotune._cache.schema import SCHEMA_VERSION, Newer, Parsed, StoreFile, Unreadable, parse, render
from autotune._env import CACHE_DIR, LOCK_TIMEOUT_S
from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("autotune")

#: the last-use marker is rewritten at most this often per process
_MARK_EVERY_S = 3600.0

#: absent: no file (or it was just quarantined), safe to write; kept: a file we must not overwrite
_Unusable = Literal["absent", "kept"]


def default_root() -> Path:
    """``AUTOTUNE_CACHE_DIR``, else the platform's user cache dir (e.g. ``~/.cache/autotune``)."""
    configured = CACHE_DIR.get()
    if configured is not None:
        return configured
    import platformdirs

    return Path(platformdirs.user_cache_dir("autotune", appauthor=False))


class Store:
    """The results files under ``root``, with an in-memory fallback when the disk cannot be used."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._memory: dict[str, StoreFile] = {}
        #: families whose save did not reach the disk (full, refused): still served next to the file
        self._unsaved: dict[str, dict[str, FamilyResult]] = {}
        self._warned: set[str] = set()
        self._locks: dict[Path, filelock.BaseFileLock] = {}
        self._marked: dict[str, float] = {}
        #: this process's saves and clears: a write that leaves the file's time and size alike, or never reaches
        #: the disk, still changes :meth:`stamp`
        self._writes = 0

    def path(self, digest: str) -> Path:
        return self.root / f"{digest}.json"

    def stamp(self, digest: str) -> tuple[int, ...]:
        """This process's writes, then the file's (mtime_ns, size): changes whenever what ``load`` returns may have,
        cheaply (a memo key)."""
        try:
            st = os.stat(self.path(digest))
        except OSError:
            return (self._writes,)
        return self._writes, st.st_mtime_ns, st.st_size

    def load(self, digest: str) -> StoreFile | None:
        """The results for ``digest``: from disk, plus what only this process's memory holds, else None."""
        remembered = self._memory.get(digest)
        if _disk.directory_problem(self.root) is not None:
            self._warn_refused()
            return remembered
        on_disk = self._read(self.path(digest))
        if not isinstance(on_disk, Parsed):
            return remembered
        self._mark_used(digest)
        unsaved = {k: v for k, v in self._unsaved.get(digest, {}).items() if k not in on_disk.valid.families}
        if not unsaved:
            return on_disk.valid
        # Families this process could only keep in memory (a write failed) still answer here.
        return on_disk.valid.model_copy(update={"families": {**on_disk.valid.families, **unsaved}})

    # -- reading -------------------------------------------------------------------------------------------

    def _read(self, path: Path) -> Parsed | _Unusable:
        try:
            raw, identity = _disk.read_regular(path)
        except FileNotFoundError:
            return "absent"
        except _disk.Refused as exc:
            self._warn_once(f"read:{path}", "cannot read %s (%s); keeping results in memory for this process",
                            path, exc)
            return "kept"
        except OSError as exc:
            self._warn_once(f"read:{path}", "cannot read %s (%s); keeping results in memory for this process",
                            path, _disk.os_reason(exc))
            return "kept"
        if raw is None:
            return self._quarantine(path, identity, f"{identity[2] / 2**20:.0f} MB, larger than any results file")
        parsed = parse(raw)
        if isinstance(parsed, Unreadable):
            return self._quarantine(path, identity, parsed.reason)
        if isinstance(parsed, Newer):
            self._warn_once(f"future:{path}", "%s was written by a newer autotune (schema %s > %s); "
                            "ignoring it and leaving it untouched", path, parsed.schema_version, SCHEMA_VERSION)
            return "kept"
        for name, problem in parsed.invalid.items():
            self._warn_once(f"family:{path}:{name}", "results of %r in %s cannot be used (%s); %r is measured again "
                            "when next asked for (they are set aside then); the other families are kept", name, path,
                            problem, name)
        return parsed

    def _quarantine(self, path: Path, identity: tuple[int, ...], reason: str) -> Parsed | _Unusable:
        target = path.with_name(f"{path.name}.corrupt-{_disk.utc_stamp()}")
        try:
            with self._lock(path):
                # Another process may have replaced the file since we read it: move only what we judged, and
                # judge the new one instead (writing over it as if absent would lose that process's results).
                if _disk.identity(os.lstat(path)) != identity:
                    return self._read(path)
                os.replace(path, target)
        except FileNotFoundError:
            return "absent"
        except (OSError, TimeoutError) as move_error:
            self._warn_once(f"corrupt:{path}", "results file %s is corrupt (%s) and could not be moved aside (%s); "
                            "its families are measured again when next asked for, their results kept in memory",
                            path, reason, move_error)
            return "kept"
        log.warning("results file %s was corrupt (%s); moved to %s; its families are measured again when next asked "
                    "for", path, reason, target.name)
        return "absent"

    # -- writing -------------------------------------------------------------------------------------------

    def save(self, fingerprint: Fingerprint, result: FamilyResult) -> StoreFile:
        """Merge ``result`` into the file for this fingerprint, under the lock; returns what is now stored."""
        digest = fingerprint.digest
        path = self.path(digest)
        remembered = self._memory.get(digest)
        families = {**(remembered.families if remembered is not None else {}), result.model_kind: result}
        merged = StoreFile(schema_version=SCHEMA_VERSION, fingerprint=fingerprint, families=families)
        self._memory[digest] = merged
        self._writes += 1
        self._unsaved.setdefault(digest, {})[result.model_kind] = result
        try:
            if _disk.directory_problem(self.root, create=True) is not None:
                self._warn_refused()
                return merged
            with self._lock(path):
                current = self._read(path)
                if current == "kept":
                    return merged
                document: dict[str, Any] = {}
                if isinstance(current, Parsed):
                    document = current.document
                    if result.model_kind in current.invalid:
                        self._set_aside(path, result.model_kind, current)
                    families = {**self._unsaved[digest], **current.valid.families, result.model_kind: result}
                    merged = current.valid.model_copy(update={"families": families})
                _disk.remove_stale_temps(path)
                write_atomic(path, render(document, fingerprint, result))
            self._memory[digest] = merged
            del self._unsaved[digest][result.model_kind]
            self._mark_used(digest, now=True)
            _disk.prune(self.root)
        except (OSError, TimeoutError) as exc:
            self._warn_once(f"write:{path}", "cannot write %s (%s); keeping results in memory for this process",
                            path, _disk.os_reason(exc))
        return merged

    def _set_aside(self, path: Path, family: str, current: Parsed) -> None:
        """Keep the unreadable record of ``family`` next to the file before its new measurement replaces it."""
        record = {"family": family, "reason": current.invalid[family], "record": current.document["families"][family]}
        target = path.with_name(f"{path.name}.{family}.corrupt-{_disk.utc_stamp()}")
        write_atomic(target, _disk.strict_json(record))
        log.warning("moved the unusable results of %r to %s", family, target.name)

    def stamps(self) -> tuple[object, ...]:
        """This process's writes, (name, mtime_ns, size) of every results file, then this process's in-memory
        digests: changes when any of them does (memo keys)."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(".json"):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        found.append((entry.name, st.st_mtime_ns, st.st_size))
        return (self._writes, *sorted(found), *((d, len(f.families), 0) for d, f in sorted(self._memory.items())))

    def all_files(self) -> list[StoreFile]:
        """Every readable results file under ``root`` (every machine configuration), then this process's
        in-memory ones that are not on disk: for export and similar-machine answers."""
        found: dict[str, StoreFile] = {}
        if _disk.directory_problem(self.root) is None:
            with contextlib.suppress(OSError):
                for path in sorted(self.root.glob("*.json")):
                    read = self._read(path)
                    if isinstance(read, Parsed):
                        found[read.valid.fingerprint.digest] = read.valid
        for digest, memory in self._memory.items():
            found.setdefault(digest, memory)
        return list(found.values())

    def clear(self) -> list[Path]:
        """Delete every results file (quarantined ones and last-use markers too); returns what was removed."""
        self._writes += 1
        self._memory.clear()
        self._unsaved.clear()
        removed = []
        candidates = {*self.root.glob("*.json"), *self.root.glob("*.corrupt-*"), *self.root.glob("*.used")}
        for path in sorted(candidates):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        return removed

    # -- locks, directory, pruning -------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the cache directory cannot be used, with what to do (``_disk.unusable_directory``); None when it
        can. Creates it where missing."""
        return _disk.unusable_directory(self.root)

    def _warn_refused(self) -> None:
        self._warn_once(f"root:{self.root}", "cannot use the cache directory: %s; results stay in this process's "
                        "memory and are measured again by the next process", self.problem())

    def calibration_lock(self, digest: str, model_kind: str, *,
                         unlocked: str = "calibrating without waiting for other processes"
                         ) -> filelock.BaseFileLock | None:
        """Held while one process calibrates one family, so others wait for its result (single flight).

        None when the directory cannot hold a lock (unwritable, refused), with one warning saying what happens
        then (``unlocked``; by default: the family is calibrated unlocked).
        """
        return lock_file(self.root, f"{digest}.{model_kind}.calibrating.lock", unlocked)

    def _lock(self, path: Path) -> filelock.BaseFileLock:
        import filelock

        lock_path = Path(f"{path}.lock")
        _disk.refuse_link(lock_path)  # filelock opens the path with O_CREAT: a planted link would create its target
        # One lock object per file, so it is reentrant: a save that finds a corrupt file quarantines it under
        # the lock it already holds (a second FileLock on the same file would wait for itself until timeout).
        # Held only for a read-merge-write of one small file; a holder that dies releases it (flock).
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = filelock.FileLock(lock_path, timeout=min(LOCK_TIMEOUT_S.get(), 30.0))
        return lock

    def _mark_used(self, digest: str, *, now: bool = False) -> None:
        """Record this use of the file for pruning (at most hourly per process unless ``now``)."""
        at = time.time()
        if not now and at - self._marked.get(digest, -math.inf) < _MARK_EVERY_S:
            return
        self._marked[digest] = at
        _disk.mark_used(self.path(digest), at)

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


__all__ = [
    "KEEP_FILES", "KEEP_QUARANTINED", "KEEP_USED_DAYS", "SCHEMA_VERSION", "Store", "StoreFile", "default_root",
    "write_atomic",
]
