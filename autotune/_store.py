"""Measurements on disk: one JSON file per fingerprint digest, written atomically, read defensively.

- A write re-reads the file under a file lock, merges, and replaces it atomically (unique temp file in the
  same directory, fsync, ``os.replace``, fsync of the directory), so two processes that calibrate different
  families never lose each other's results and a crash mid-write never leaves a torn file.
- A corrupt or unreadable file is a cache miss plus one WARNING: it is renamed to ``*.corrupt-<utc>`` and the
  family is measured again. A file written by a newer autotune is ignored and never overwritten.
- Nothing read from disk is executed: JSON validated by pydantic, no pickle, no eval.
- A disk that cannot be written (read-only, full, locked) degrades to an in-memory store for this process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, ValidationError

from autotune._fingerprint import Fingerprint
from autotune._models import FamilyResult, Record

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("autotune")

SCHEMA_VERSION = 1
#: results files of other fingerprints kept (a swapped-out eGPU comes back); older ones are pruned
KEEP_FILES = 16


class StoreFile(Record):
    """The content of one results file."""

    schema_version: int
    fingerprint: Fingerprint
    families: dict[str, FamilyResult]
    note: str = Field(default="", description="free text, e.g. where a recorded fixture's numbers come from")


def default_root() -> Path:
    """``AUTOTUNE_CACHE_DIR``, else the platform's user cache dir (e.g. ``~/.cache/autotune``)."""
    from autotune._env import CACHE_DIR

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
        self._warned: set[str] = set()
        self._locks: dict[Path, filelock.BaseFileLock] = {}

    def path(self, digest: str) -> Path:
        return self.root / f"{digest}.json"

    def stamp(self, digest: str) -> tuple[int, int] | None:
        """(mtime_ns, size) of the file, to notice another process's write cheaply."""
        try:
            st = os.stat(self.path(digest))
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def load(self, digest: str) -> StoreFile | None:
        """The results for ``digest``: from disk, else from this process's memory, else None."""
        on_disk = self._read(self.path(digest))
        if isinstance(on_disk, StoreFile):
            return on_disk
        return self._memory.get(digest)

    def _read(self, path: Path) -> StoreFile | str | None:
        """The parsed file, None when absent, or the string "future" for a newer schema."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn_once(f"read:{path}", "cannot read %s (%s); measuring again", path, exc)
            return None
        try:
            return StoreFile.model_validate_json(raw)  # the warm path: parsed and validated in one pass
        except ValidationError as exc:
            invalid: Exception = exc
        # Not a file of ours as we know it: a newer schema is left alone, anything else is quarantined.
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if isinstance(version, int) and version > SCHEMA_VERSION:
            self._warn_once(f"future:{path}", "%s was written by a newer autotune (schema %s > %s); "
                            "ignoring it and leaving it untouched", path, version, SCHEMA_VERSION)
            return "future"
        self._quarantine(path, raw, invalid)
        return None

    def _quarantine(self, path: Path, raw: bytes, exc: Exception) -> None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        reason = str(exc).splitlines()[0][:200]
        try:
            with self._lock(path):
                # Another process may have replaced the file since we read it: move only what we judged.
                if path.read_bytes() != raw:
                    return
                os.replace(path, target)
        except (OSError, TimeoutError) as move_error:
            log.warning("results file %s is corrupt (%s) and could not be moved aside (%s); measuring again",
                        path, reason, move_error)
            return
        log.warning("results file %s was corrupt (%s); moved to %s; measuring again", path, reason, target.name)

    def save(self, fingerprint: Fingerprint, result: FamilyResult) -> StoreFile:
        """Merge ``result`` into the file for this fingerprint, under the lock; returns what is now stored."""
        digest = fingerprint.digest
        path = self.path(digest)
        merged = self._merge(self._memory.get(digest), fingerprint, result)
        self._memory[digest] = merged
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            with self._lock(path):
                current = self._read(path)
                if current == "future":
                    return merged
                merged = self._merge(current if isinstance(current, StoreFile) else None, fingerprint, result)
                self._write_atomic(path, merged.model_dump_json(indent=1).encode())
            self._memory[digest] = merged
            self._prune()
        except (OSError, TimeoutError) as exc:
            self._warn_once(f"write:{path}", "cannot write %s (%s); keeping results in memory for this process",
                            path, exc)
        return merged

    @staticmethod
    def _merge(current: StoreFile | None, fingerprint: Fingerprint, result: FamilyResult) -> StoreFile:
        families = dict(current.families) if current is not None else {}
        families[result.model_kind] = result
        note = current.note if current is not None else ""
        return StoreFile(schema_version=SCHEMA_VERSION, fingerprint=fingerprint, families=families, note=note)

    def clear(self) -> list[Path]:
        """Delete every results file (quarantined ones too); returns what was removed."""
        self._memory.clear()
        removed = []
        for path in sorted(self.root.glob("*.json*")):
            if path.suffix == ".lock":
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        return removed

    def calibration_lock(self, digest: str, model_kind: str) -> filelock.BaseFileLock:
        """Held while one process calibrates one family, so others wait for its result (single flight)."""
        import filelock

        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return filelock.FileLock(self.root / f"{digest}.{model_kind}.calibrating.lock")

    def _lock(self, path: Path) -> filelock.BaseFileLock:
        import filelock

        from autotune._env import LOCK_TIMEOUT_S

        # One lock object per file, so it is reentrant: a save that finds a corrupt file quarantines it under
        # the lock it already holds (a second FileLock on the same file would wait for itself until timeout).
        # Held only for a read-merge-write of one small file; a holder that dies releases it (flock).
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = filelock.FileLock(f"{path}.lock", timeout=min(LOCK_TIMEOUT_S.get(), 30.0))
        return lock

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if os.name == "posix":
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _prune(self) -> None:
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[KEEP_FILES:]:
            with contextlib.suppress(OSError):
                old.unlink()
                log.info("pruned results of an old machine configuration: %s", old.name)

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


__all__ = ["SCHEMA_VERSION", "Store", "StoreFile", "default_root"]
