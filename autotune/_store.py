"""Measurements on disk: one JSON file per fingerprint digest, written atomically, read defensively.

- A write re-reads the file under a file lock, merges, and replaces it atomically (unique temp file in the
  same directory, fsync, ``os.replace``, fsync of the directory), so two processes that calibrate different
  families never lose each other's results and a crash mid-write never leaves a torn file.
- Each family is validated on its own. A family this version cannot read (a value added by a newer version,
  wrong types, NaN where a number belongs) is set aside with a WARNING and measured again, while the other
  families keep serving; when its new measurement is saved, the old record is moved to
  ``<file>.<family>.corrupt-<utc>``. Everything else in the file, fields this version does not know included,
  is written back as it was read.
- A file that is not a results file at all (not JSON, truncated, too large, wrong types at the top) is renamed
  to ``*.corrupt-<utc>`` and its families are measured again. A file written by a newer schema, a file that
  cannot be read, a symbolic link, or anything but a regular file is never overwritten: results stay in
  memory for this process. So does a results directory that other users can write.
- Nothing read from disk is executed: JSON validated by pydantic, no pickle, no eval.
- A disk that cannot be written (read-only, full, locked) degrades to an in-memory store for this process.
- Pruning keeps every results file used in the last 30 days (each use writes the time into ``<digest>.used``,
  so it does not depend on atime or on another environment's writes) and the few newest quarantined files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import math
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from autotune._fingerprint import Fingerprint
from autotune._models import FamilyResult, Record

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("autotune")

SCHEMA_VERSION = 1
#: results files kept whatever their age (a swapped-out eGPU comes back); beyond them, unused ones are pruned
KEEP_FILES = 16
#: a results file used within this many days is never pruned
KEEP_USED_DAYS = 30
#: quarantined ``*.corrupt-*`` files kept for a post-mortem; older ones are pruned
KEEP_QUARANTINED = 3
#: a results file of every family is tens of kB; anything larger is not ours and is not read into memory
MAX_FILE_BYTES = 8 * 2**20
#: the last-use marker is rewritten at most this often per process
_MARK_EVERY_S = 3600.0

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)



def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: temp file in the same directory, fsync, os.replace,
    then fsync the directory (POSIX), so a crash leaves the old file or the new one, never half of either."""
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


class StoreFile(Record):
    """The content of one results file: the families this version can serve."""

    schema_version: int
    fingerprint: Fingerprint
    families: dict[str, FamilyResult]
    note: str = Field(default="", description="free text, e.g. where a recorded fixture's numbers come from")


@dataclass(frozen=True)
class _Parsed:
    """One results file as read: ``document`` is written back as is, unknown fields included."""

    document: dict[str, Any]
    valid: StoreFile
    #: family -> why it is set aside
    invalid: dict[str, str]


#: absent: no file (or it was just quarantined), safe to write; kept: a file we must not overwrite
_Unusable = Literal["absent", "kept"]


class _Refused(Exception):
    """The results path is something we will not read: a link, a directory, a device."""


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
        #: families whose save did not reach the disk (full, refused): still served next to the file
        self._unsaved: dict[str, dict[str, FamilyResult]] = {}
        self._warned: set[str] = set()
        self._locks: dict[Path, filelock.BaseFileLock] = {}
        self._marked: dict[str, float] = {}

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
        """The results for ``digest``: from disk, plus what only this process's memory holds, else None."""
        remembered = self._memory.get(digest)
        problem = self._root_problem()
        if problem is not None:
            self._warn_once(f"root:{self.root}", "refusing the results directory %s (%s); keeping results in "
                            "memory for this process", self.root, problem)
            return remembered
        on_disk = self._read(self.path(digest))
        if not isinstance(on_disk, _Parsed):
            return remembered
        self._mark_used(digest)
        unsaved = {k: v for k, v in self._unsaved.get(digest, {}).items() if k not in on_disk.valid.families}
        if not unsaved:
            return on_disk.valid
        # Families this process could only keep in memory (a write failed) still answer here.
        return on_disk.valid.model_copy(update={"families": {**on_disk.valid.families, **unsaved}})

    # -- reading -------------------------------------------------------------------------------------------

    def _read(self, path: Path) -> _Parsed | _Unusable:
        try:
            raw, identity = _read_regular(path)
        except FileNotFoundError:
            return "absent"
        except _Refused as exc:
            self._warn_once(f"read:{path}", "cannot read %s (%s); keeping results in memory for this process",
                            path, exc)
            return "kept"
        except OSError as exc:
            self._warn_once(f"read:{path}", "cannot read %s (%s); keeping results in memory for this process",
                            path, _os_reason(exc))
            return "kept"
        if raw is None:
            return self._quarantine(path, identity, f"{identity[2] / 2**20:.0f} MB, larger than any results file")
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
            return self._quarantine(path, identity, f"not JSON: {str(exc)[:120] or type(exc).__name__}")
        if not isinstance(document, dict):
            return self._quarantine(path, identity, f"a JSON {type(document).__name__}, not an object")
        version = document.get("schema_version")
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            self._warn_once(f"future:{path}", "%s was written by a newer autotune (schema %s > %s); "
                            "ignoring it and leaving it untouched", path, version, SCHEMA_VERSION)
            return "kept"
        families = document.get("families")
        if not isinstance(families, dict):
            return self._quarantine(path, identity, "'families' is not an object")
        try:
            header = StoreFile.model_validate({**document, "families": {}})
        except ValidationError as exc:
            return self._quarantine(path, identity, _first_error(exc))
        if header.schema_version != SCHEMA_VERSION:
            return self._quarantine(path, identity, f"schema {header.schema_version}, expected {SCHEMA_VERSION}")
        valid: dict[str, FamilyResult] = {}
        invalid: dict[str, str] = {}
        for name, record in families.items():
            result, problem = _validate_family(name, record)
            if result is not None:
                valid[name] = result
            else:
                invalid[name] = problem or "invalid"
                self._warn_once(f"family:{path}:{name}", "results of %r in %s cannot be used (%s); setting them "
                                "aside and measuring %r again; the other families are kept", name, path,
                                invalid[name], name)
        return _Parsed(document, header.model_copy(update={"families": valid}), invalid)

    def _quarantine(self, path: Path, identity: tuple[int, ...], reason: str) -> _Parsed | _Unusable:
        target = path.with_name(f"{path.name}.corrupt-{_utc_stamp()}")
        try:
            with self._lock(path):
                # Another process may have replaced the file since we read it: move only what we judged, and
                # judge the new one instead (writing over it as if absent would lose that process's results).
                if _identity(os.lstat(path)) != identity:
                    return self._read(path)
                os.replace(path, target)
        except FileNotFoundError:
            return "absent"
        except (OSError, TimeoutError) as move_error:
            self._warn_once(f"corrupt:{path}", "results file %s is corrupt (%s) and could not be moved aside (%s); "
                            "measuring again, keeping results in memory", path, reason, move_error)
            return "kept"
        log.warning("results file %s was corrupt (%s); moved to %s; measuring again", path, reason, target.name)
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
        self._unsaved.setdefault(digest, {})[result.model_kind] = result
        try:
            problem = self._root_problem(create=True)
            if problem is not None:
                self._warn_once(f"root:{self.root}", "refusing the results directory %s (%s); keeping results in "
                                "memory for this process", self.root, problem)
                return merged
            with self._lock(path):
                current = self._read(path)
                if current == "kept":
                    return merged
                document: dict[str, Any] = {}
                if isinstance(current, _Parsed):
                    document = current.document
                    if result.model_kind in current.invalid:
                        self._set_aside(path, result.model_kind, current)
                    families = {**self._unsaved[digest], **current.valid.families, result.model_kind: result}
                    merged = current.valid.model_copy(update={"families": families})
                self._remove_stale_temps(path)
                write_atomic(path, _render(document, fingerprint, result))
            self._memory[digest] = merged
            del self._unsaved[digest][result.model_kind]
            self._mark_used(digest, now=True)
            self._prune()
        except (OSError, TimeoutError) as exc:
            self._warn_once(f"write:{path}", "cannot write %s (%s); keeping results in memory for this process",
                            path, _os_reason(exc))
        return merged

    def _set_aside(self, path: Path, family: str, current: _Parsed) -> None:
        """Keep the unreadable record of ``family`` next to the file before its new measurement replaces it."""
        record = {"family": family, "reason": current.invalid[family], "record": current.document["families"][family]}
        target = path.with_name(f"{path.name}.{family}.corrupt-{_utc_stamp()}")
        write_atomic(target, json.dumps(record, indent=1).encode())
        log.warning("moved the unusable results of %r to %s", family, target.name)

    def _remove_stale_temps(self, path: Path) -> None:
        # Under the file's lock no other writer is between mkstemp and os.replace: any temp file left is a
        # writer that died (SIGKILL, power loss).
        for stale in self.root.glob(f".{path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def stamps(self) -> tuple[tuple[str, int, int], ...]:
        """(name, mtime_ns, size) of every results file, then this process's in-memory digests: changes when any
        of them does (memo keys)."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(".json"):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        found.append((entry.name, st.st_mtime_ns, st.st_size))
        return (*sorted(found), *((d, len(f.families), 0) for d, f in sorted(self._memory.items())))

    def all_files(self) -> list[StoreFile]:
        """Every readable results file under ``root`` (every machine configuration), then this process's
        in-memory ones that are not on disk: for export and similar-machine answers."""
        found: dict[str, StoreFile] = {}
        if self._root_problem() is None:
            with contextlib.suppress(OSError):
                for path in sorted(self.root.glob("*.json")):
                    read = self._read(path)
                    if isinstance(read, _Parsed):
                        found[read.valid.fingerprint.digest] = read.valid
        for digest, memory in self._memory.items():
            found.setdefault(digest, memory)
        return list(found.values())

    def clear(self) -> list[Path]:
        """Delete every results file (quarantined ones and last-use markers too); returns what was removed."""
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

    def calibration_lock(self, digest: str, model_kind: str) -> filelock.BaseFileLock | None:
        """Held while one process calibrates one family, so others wait for its result (single flight).

        None when the directory cannot hold a lock (unwritable, refused): the family is calibrated unlocked.
        """
        import filelock

        path = self.root / f"{digest}.{model_kind}.calibrating.lock"
        try:
            problem = self._root_problem(create=True)
            if problem is None:
                _refuse_link(path)
        except OSError as exc:
            problem = _os_reason(exc)
        if problem is not None:
            self._warn_once(f"lock:{path}", "cannot use the calibration lock %s (%s); calibrating without waiting "
                            "for other processes", path, problem)
            return None
        return filelock.FileLock(path)

    def _lock(self, path: Path) -> filelock.BaseFileLock:
        import filelock

        from autotune._env import LOCK_TIMEOUT_S

        lock_path = Path(f"{path}.lock")
        _refuse_link(lock_path)  # filelock opens the path with O_CREAT: a planted link would create its target
        # One lock object per file, so it is reentrant: a save that finds a corrupt file quarantines it under
        # the lock it already holds (a second FileLock on the same file would wait for itself until timeout).
        # Held only for a read-merge-write of one small file; a holder that dies releases it (flock).
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = filelock.FileLock(lock_path, timeout=min(LOCK_TIMEOUT_S.get(), 30.0))
        return lock

    def _root_problem(self, *, create: bool = False) -> str | None:
        """Why the results directory must not be used; None when it is ours alone (or absent, not creating)."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return _os_reason(exc)
        if not stat.S_ISDIR(st.st_mode):
            return "not a directory"
        if os.name == "posix":
            # Another user who can write here can plant results (or links) that this process would act on.
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"writable by other users, mode {stat.S_IMODE(st.st_mode):o}"
            if st.st_uid != os.geteuid():
                return f"owned by another user (uid {st.st_uid})"
        return None

    def _mark_used(self, digest: str, *, now: bool = False) -> None:
        """Write the time of this use into ``<digest>.used``, which pruning reads (at most hourly)."""
        at = time.time()
        if not now and at - self._marked.get(digest, -math.inf) < _MARK_EVERY_S:
            return
        self._marked[digest] = at
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.root / f"{digest}.used", flags, 0o600)
            try:
                os.write(fd, f"{at:.0f}\n".encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("cannot record the use of %s (%s)", digest, exc)

    def _last_used(self, results: Path) -> float:
        marker = results.with_suffix(".used")
        try:
            return float(marker.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            pass
        try:
            return results.stat().st_mtime  # written before markers existed, or marker unreadable
        except OSError:
            return 0.0

    def _prune(self) -> None:
        now = time.time()
        used = sorted(((self._last_used(p), p) for p in self.root.glob("*.json")), reverse=True)
        for last_used, old in used[KEEP_FILES:]:
            if now - last_used < KEEP_USED_DAYS * 86400:
                continue
            with contextlib.suppress(OSError):
                old.unlink()
                log.info("pruned results of a machine configuration unused for %d days: %s",
                         (now - last_used) // 86400, old.name)
            with contextlib.suppress(OSError):
                old.with_suffix(".used").unlink()
        quarantined = sorted(self.root.glob("*.corrupt-*"), key=lambda p: p.name.rsplit(".corrupt-", 1)[1],
                             reverse=True)
        for old in quarantined[KEEP_QUARANTINED:]:
            with contextlib.suppress(OSError):
                old.unlink()

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


def _read_regular(path: Path) -> tuple[bytes | None, tuple[int, ...]]:
    """The bytes of a regular file (None when too large to be ours) and its identity, never following a link."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _Refused("it is a symbolic link; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        raise _Refused("it is not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise _Refused("it is a symbolic link; refusing to follow it") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("it is not a regular file")
        identity = _identity(st)
        if st.st_size > MAX_FILE_BYTES:
            return None, identity
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_FILE_BYTES:
                return None, identity
        return b"".join(chunks), identity
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _refuse_link(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise OSError(errno.ELOOP, "a symbolic link; refusing to follow it", str(path))


def _validate_family(name: str, record: object) -> tuple[FamilyResult | None, str | None]:
    """The family's record validated on its own, or why it cannot be used."""
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    try:
        result = FamilyResult.model_validate(record)
    except ValidationError as exc:
        return None, _first_error(exc)
    except RecursionError:
        return None, "nested too deeply"
    if result.model_kind != name:
        return None, f"it is the record of {result.model_kind!r}"
    try:
        dt.datetime.fromisoformat(result.measured_at)
    except ValueError:
        return None, f"measured_at {result.measured_at[:40]!r} is not a time"
    nan = _nan_number(result)
    if nan is not None:
        return None, f"NaN in {nan}, where a measured number belongs"
    return result, None


def _nan_number(result: FamilyResult) -> str | None:
    """The first measured number the decision relies on that is NaN (losses of a failed candidate may be)."""
    numbers: list[tuple[str, float | None]] = [
        ("wall_s", result.wall_s), ("budget_s", result.budget_s), ("worker_start_s", result.worker_start_s),
        *((f"control_ms[{i}]", v) for i, v in enumerate(result.control_ms)),
    ]
    for r in result.candidates:
        label = r.candidate.label
        numbers += [(f"{label} setup_s", r.setup_s), (f"{label} first_step_ms", r.first_step_ms)]
        if r.timing is not None:
            t = r.timing
            numbers += [(f"{label} median_ms", t.median_ms), (f"{label} spread", t.spread)]
            numbers += [(f"{label} round_ms[{i}]", v) for i, v in enumerate(t.round_ms)]
            if t.vs_baseline is not None:
                b = t.vs_baseline
                numbers += [(f"{label} vs_baseline", v) for v in (b.estimate, b.low, b.high)]
    return next((where for where, value in numbers if value is not None and math.isnan(value)), None)


def _render(document: dict[str, Any], fingerprint: Fingerprint, result: FamilyResult) -> bytes:
    """``document`` with ``result`` in its families; every other field is written back as read."""
    families = dict(document.get("families") or {})
    families[result.model_kind] = json.loads(result.model_dump_json())  # Infinity stays Infinity
    rendered = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": document.get("fingerprint") or json.loads(fingerprint.model_dump_json()),
        "families": families,
        "note": document.get("note", ""),
    }
    rendered.update((k, v) for k, v in document.items() if k not in rendered)
    return json.dumps(rendered, indent=1).encode()


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"[:200]


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) if exc.errno is not None else str(exc)


def _utc_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


__all__ = [
    "KEEP_FILES", "KEEP_QUARANTINED", "KEEP_USED_DAYS", "SCHEMA_VERSION", "Store", "StoreFile", "default_root",
    "write_atomic",
]
