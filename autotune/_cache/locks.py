"""Waiting for the cache's file locks: a family's single flight, and one measurement at a time per machine.

Two processes (an app and ``python -m autotune``, two apps) or two background jobs of one app that time
training steps at the same time measure each other: each gets the other's interference in its rounds (on a
machine of few cores, a neighbour's ``import torch`` alone slows a step), and the control workload cannot tell
it from a busy machine. So a calibration and the canary (``--check``) hold the machine's
measuring lock (:func:`measuring_lock`) while they time; the others wait their turn. A wait gives up at once when the
calibration is cancelled (a background job's ``cancel()``), and after ``AUTOTUNE_LOCK_TIMEOUT_S``.

Limits: the lock is per user (two users' calibrations on one machine do not wait for each other); waits poll,
so turns are not first come, first served; a calibration takes its turn per family, and a family waiting for
its turn holds its own family lock meanwhile (another process wanting that family's result waits longer).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import _env
from autotune._cache import disk as _disk
from autotune._errors import CalibrationCancelled

if TYPE_CHECKING:
    import filelock

log = logging.getLogger("autotune")

#: how often a wait looks whether it was cancelled
_POLL_S = 0.1
_warned: set[str] = set()


def lock_file(directory: Path, name: str, consequence: str, *, chosen_by: str | None = "AUTOTUNE_CACHE_DIR"
              ) -> filelock.BaseFileLock | None:
    """A file lock ``name`` in ``directory`` (created if missing; a planted link refused). None, with one
    warning that says why, what to do (``chosen_by``: the setting that picks the directory) and ``consequence``,
    where the directory cannot hold it (unwritable, refused)."""
    import filelock

    path = directory / name
    problem = _disk.unusable_directory(directory, chosen_by=chosen_by)
    if problem is None:
        try:
            _disk.refuse_link(path)  # filelock opens the path with O_CREAT: a planted link would create its target
        except OSError as exc:
            problem = f"{path}: {_disk.os_reason(exc)}"
    if problem is not None:
        if str(path) not in _warned:
            _warned.add(str(path))
            log.warning("cannot use the lock %s: %s; %s", name, problem, consequence)
        return None
    return filelock.FileLock(path)


def measuring_lock() -> filelock.BaseFileLock | None:
    """The lock of this machine's measurements, one per user: in the temporary directory, which is the
    machine's own even where the cache directory is shared (a network home), and the same whatever cache
    directory a process uses. None, with one warning, where it cannot be used."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return lock_file(Path(tempfile.gettempdir()) / f"autotune-{user}", "measuring.lock",
                     "measuring without waiting for other measurements", chosen_by=None)


def held_elsewhere(lock: filelock.BaseFileLock | None) -> bool:
    """True while another process or thread holds ``lock``: a look, not a claim."""
    import filelock

    if lock is None:
        return False
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    except OSError:
        return False
    lock.release()
    return False


def acquire(lock: filelock.BaseFileLock, *, cancelled: Callable[[], bool] = lambda: False) -> bool:
    """Take ``lock``, waiting up to ``AUTOTUNE_LOCK_TIMEOUT_S``; False when that wait timed out. Raises
    :class:`CalibrationCancelled` as soon as ``cancelled()`` says so."""
    import filelock

    deadline = time.monotonic() + _env.LOCK_TIMEOUT_S.get()
    while True:
        try:
            lock.acquire(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
            return True
        except filelock.Timeout:
            if cancelled():
                raise CalibrationCancelled() from None
            if time.monotonic() >= deadline:
                return False


@contextlib.contextmanager
def measuring(*, cancelled: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold the machine's measuring lock while timing steps, after whatever else measures here has finished."""
    lock = measuring_lock()
    if lock is None:
        yield
        return
    if held_elsewhere(lock):
        log.info("another calibration is measuring on this machine; waiting for it to finish, so that neither "
                 "skews the other's timings")
    if not acquire(lock, cancelled=cancelled):
        log.warning("another calibration has been measuring for over %g s (AUTOTUNE_LOCK_TIMEOUT_S); measuring "
                    "alongside it: both may be slowed", _env.LOCK_TIMEOUT_S.get())
        yield
        return
    try:
        yield
    finally:
        lock.release()


def reset() -> None:
    """Forget which locks this process warned it cannot use: the next failure warns again."""
    _warned.clear()


__all__ = ["acquire", "held_elsewhere", "lock_file", "measuring", "measuring_lock", "reset"]
