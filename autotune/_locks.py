"""Waiting for the cache's file locks: a family's single flight, and one measurement at a time per machine.

Two processes (an app and ``python -m autotune``, two apps) or two background jobs of one app that time
training steps at the same time measure each other: each gets the other's interference in its rounds (on a
2-core machine, a neighbour's ``import torch`` alone slows a step by tens of percent), and the control
workload cannot tell it from a busy machine. So anything that times steps holds the machine's measuring lock
(:meth:`~autotune._store.Store.measuring_lock`); the others wait their turn. A wait gives up at once when the
calibration is cancelled (a background job's ``cancel()``), and after ``AUTOTUNE_LOCK_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from autotune import _env
from autotune._errors import CalibrationCancelled

if TYPE_CHECKING:
    import filelock

    from autotune._store import Store

log = logging.getLogger("autotune")

#: how often a wait looks whether it was cancelled
_POLL_S = 0.1


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
def measuring(store: Store, *, cancelled: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold the machine's measuring lock while timing steps, after whatever else measures here has finished."""
    lock = store.measuring_lock()
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


__all__ = ["acquire", "held_elsewhere", "measuring"]
