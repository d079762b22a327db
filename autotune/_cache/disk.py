"""Files that crashes, other processes and other users may have touched: written whole, read without following
links, in a directory that is ours alone, pruned by last use.

- ``write_atomic``: unique temp file in the same directory, fsync, ``os.replace``, fsync of the directory, so a
  crash leaves the old file or the new one, never half of either; a writer's leftover temp files are removed
  by the next writer of the same file.
- ``read_regular``: a regular file's bytes (never a link, a directory, a named pipe, nor more than
  ``MAX_FILE_BYTES``), and its identity, to notice another process replacing it.
- ``load_json``: a file's JSON with every string in it :func:`~autotune._wording.printable`: the one way text from a
  file reaches reasons, ``--explain``, log lines and errors, whatever sink says it.
- ``directory_problem``: a directory other users can write is refused (they could plant results or links).
- Pruning keeps every file used in the last ``KEEP_USED_DAYS`` days (each use writes the time into
  ``<digest>.used``, so it depends neither on atime nor on another environment's writes), the
  ``KEEP_FILES`` most recently used whatever their age, and the ``KEEP_QUARANTINED`` newest quarantined files.
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("autotune")

#: results files kept whatever their age (a swapped-out eGPU comes back); beyond them, unused ones are pruned
KEEP_FILES = 16
#: a results file used within this many days is never pruned
KEEP_USED_DAYS = 30
#: quarantined ``*.corrupt-*`` files kept for a post-mortem; older ones are pruned
KEEP_QUARANTINED = 3
#: a results file of every family is tens of kB; anything larger is not ours and is not read into memory
MAX_FILE_BYTES = 8 * 2**20

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class Refused(Exception):
    """The path is something we will not read: a link, a directory, a device."""


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


def remove_stale_temps(path: Path) -> None:
    """Remove ``write_atomic``'s temp files for ``path``. Call it holding the file's lock: then no other writer is
    between mkstemp and os.replace, and any temp file left is a writer that died (SIGKILL, power loss)."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


def read_regular(path: Path) -> tuple[bytes | None, tuple[int, ...]]:
    """The bytes of a regular file (None when too large to be ours) and its identity, never following a link.

    Raises FileNotFoundError, :class:`Refused` (a link, not a regular file) or another OSError.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused("it is a symbolic link; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        raise Refused("it is not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise Refused("it is a symbolic link; refusing to follow it") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("it is not a regular file")
        found = identity(st)
        if st.st_size > MAX_FILE_BYTES:
            return None, found
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_FILE_BYTES:
                return None, found
        return b"".join(chunks), found
    finally:
        os.close(fd)


def load_json(raw: bytes) -> Any:
    """The JSON document in a file's bytes, every string in it (keys too) made printable: no control character, at
    most ``TEXT_CHARS`` characters. Raises ValueError (not JSON, not UTF-8) or RecursionError (nested too deeply)."""
    # Here, not at import: the command line's early worker start reads the lock's path before anything loads pydantic
    from autotune._wording import printable

    def _printable(value: Any) -> Any:
        if isinstance(value, str):
            return printable(value)
        if isinstance(value, dict):
            return {printable(k): _printable(v) for k, v in value.items()}
        if isinstance(value, list):
            return [_printable(v) if isinstance(v, (str, dict, list)) else v for v in value]  # a number needs no call
        return value

    return _printable(json.loads(raw))


def identity(st: os.stat_result) -> tuple[int, ...]:
    """What changes when another process replaces or rewrites the file."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def refuse_link(path: Path) -> None:
    """Raise OSError(ELOOP) when ``path`` is a symbolic link (before something opens it with O_CREAT)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise OSError(errno.ELOOP, "a symbolic link; refusing to follow it", str(path))


def directory_problem(root: Path, *, create: bool = False) -> str | None:
    """Why ``root`` must not be used; None when it is ours alone (or absent, not creating). Created 0700."""
    if create:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return os_reason(exc)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if sys.platform != "win32":  # POSIX permissions (a platform check mypy understands: geteuid)
        # Another user who can write here can plant results (or links) that this process would act on.
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"writable by other users, mode {stat.S_IMODE(st.st_mode):o}"
        if st.st_uid != os.geteuid():
            return f"owned by another user (uid {st.st_uid})"
    return None


def unusable_directory(root: Path, *, chosen_by: str | None = "AUTOTUNE_CACHE_DIR") -> str | None:
    """Why ``root`` cannot hold autotune's files, naming it and saying what to do, e.g. ``'/x is a file, not a
    directory: move the file away, or point AUTOTUNE_CACHE_DIR at a directory of your own'``; None when it can (it
    is created where missing). ``chosen_by``: the setting that picks the directory, for the advice."""
    elsewhere = f", or point {chosen_by} at a directory of your own" if chosen_by else ""
    try:
        problem = directory_problem(root, create=True)
    except FileExistsError:
        problem = "not a directory"
    except OSError as exc:
        return f"{root} cannot be created ({os_reason(exc)}): make it yourself{elsewhere}"
    if problem is None:
        return None
    if problem == "not a directory":
        return f"{root} is a file, not a directory: move the file away{elsewhere}"
    if problem.startswith("writable by other users"):
        mode = problem.rpartition(" ")[2]
        return (f"{root} is writable by other users (mode {mode}), who could plant files there that autotune would "
                f"trust: chmod 700 {root}{elsewhere}")
    if problem.startswith("owned by another user"):
        return f"{root} is {problem}: autotune trusts only a directory of your own; chown it{elsewhere}"
    return f"{root}: {problem}"


#: a non-finite float in a JSON file: the string pydantic's records write (``ser_json_inf_nan="strings"``)
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def strict_json(document: Any) -> bytes:
    """``document`` as strict JSON (every parser reads it), e.g. for a file: a NaN or infinite float is written as
    the string records use (``"NaN"``, ``"Infinity"``), also one kept from a file that held the bare constant."""

    def strict(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return _NON_FINITE[repr(value)]
        if isinstance(value, dict):
            return {k: strict(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strict(v) for v in value]
        return value

    return json.dumps(strict(document), indent=1, allow_nan=False).encode()


def mark_used(results: Path, at: float) -> None:
    """Write the time of a use of ``results`` into its ``.used`` marker, which pruning reads."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(results.with_suffix(".used"), flags, 0o600)
        try:
            os.write(fd, f"{at:.0f}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.debug("cannot record the use of %s (%s)", results.name, exc)


def _last_used(results: Path) -> float:
    marker = results.with_suffix(".used")
    try:
        return float(marker.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        pass
    try:
        return results.stat().st_mtime  # written before markers existed, or marker unreadable
    except OSError:
        return 0.0


def prune(root: Path) -> None:
    """Remove results files unused for ``KEEP_USED_DAYS`` beyond the ``KEEP_FILES`` most recently used, and
    quarantined files beyond the ``KEEP_QUARANTINED`` newest."""
    now = time.time()
    used = sorted(((_last_used(p), p) for p in root.glob("*.json")), reverse=True)
    for last_used, old in used[KEEP_FILES:]:
        if now - last_used < KEEP_USED_DAYS * 86400:
            continue
        with contextlib.suppress(OSError):
            old.unlink()
            log.info("pruned results of a machine configuration unused for %d days: %s",
                     (now - last_used) // 86400, old.name)
        with contextlib.suppress(OSError):
            old.with_suffix(".used").unlink()
    quarantined = sorted(root.glob("*.corrupt-*"), key=lambda p: p.name.rsplit(".corrupt-", 1)[1], reverse=True)
    for old in quarantined[KEEP_QUARANTINED:]:
        with contextlib.suppress(OSError):
            old.unlink()


def os_reason(exc: OSError) -> str:
    """The OS's words for ``exc`` ("Permission denied"), without the errno and path clutter."""
    return exc.strerror or str(exc) if exc.errno is not None else str(exc)


def utc_stamp() -> str:
    """The time now, for quarantined file names: sorts in time order (``20261130T184410123456Z``)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


__all__ = [
    "KEEP_FILES", "KEEP_QUARANTINED", "KEEP_USED_DAYS", "MAX_FILE_BYTES", "Refused", "directory_problem",
    "identity", "load_json", "mark_used", "os_reason", "prune", "read_regular", "refuse_link", "remove_stale_temps",
    "strict_json", "unusable_directory",
    "utc_stamp", "write_atomic",
]
