"""Starting the worker's OS process, and starting it early: before the host has imported torch.

A worker start is an interpreter start, ``import torch`` and torch's first optimizer: seconds. ``python -m
autotune`` pays its own ``import torch`` before it knows what to measure; started first (:func:`start_early`),
the worker's start overlaps the host's import instead of following it, and the first
:class:`~autotune._worker.worker.Worker` that needs a process takes this one (:func:`take`). One nobody takes
(every family was cached, a usage error) is killed when the command ends (:func:`discard`) or the host exits.
This module imports nothing from torch, nor anything that does: it runs before torch is loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import time

from autotune import _env
from autotune._cache.locks import held_elsewhere, measuring_lock
from autotune._errors import ConfigurationError

if sys.platform == "win32":
    from autotune._worker._windows import ProcessTree
else:
    from autotune._worker._posix import ProcessTree


def worker_argv() -> list[str]:
    """How the host starts a worker: this interpreter, autotune's own entry point (never the app's), and the
    host's pid (the worker dies with it)."""
    return [sys.executable, "-m", "autotune._calibration.entry", str(os.getpid())]


#: the worker started early, and when: at most one, until a Worker takes it
_early: list[tuple[ProcessTree, float]] = []
_registered: list[bool] = []  # the exit hook, once


def start_early() -> None:
    """Start a worker now, for the first :class:`Worker` of this process to take. Nothing when calibration runs
    in-process (or the setting is invalid: the command reports that), on a single core (the imports could not
    overlap, and a worker not needed would slow the host's down), while another process measures on this
    machine (a second ``import torch`` would skew its timings; the calibration then starts its worker when its
    turn comes) or when a process cannot be started (the worker then starts, and says why it cannot, when it is
    needed)."""
    try:
        if _early or _env.ISOLATION.get() != "subprocess" or _cores() < 2 or held_elsewhere(measuring_lock()):
            return
    except ConfigurationError:
        return
    try:
        _early.append((ProcessTree(worker_argv()), time.perf_counter()))
    except OSError:
        return
    if not _registered:
        atexit.register(discard, os.getpid())
        _registered.append(True)


def take(argv: list[str]) -> tuple[ProcessTree, float] | None:
    """The worker started early (its process and when it was launched), if it runs ``argv`` and is still
    running; it is then the caller's."""
    try:
        early = _early.pop()
    except IndexError:  # none, or another thread's Worker took it
        return None
    if argv == worker_argv() and early[0].proc.poll() is None:
        return early
    _stop(early[0])
    return None


def discard(owner: int | None = None) -> None:
    """Kill the worker started early if no one took it (at exit: only in the process that started it, not in a
    forked child, ``owner``)."""
    if owner is not None and owner != os.getpid():
        return
    with contextlib.suppress(IndexError):
        while True:
            _stop(_early.pop()[0])


def _cores() -> int:
    """The cores this process may run on (its affinity where the OS has one: a container's share)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _stop(tree: ProcessTree) -> None:
    tree.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        tree.proc.wait(timeout=5)
    for stream in (tree.proc.stdin, tree.proc.stdout, tree.proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


__all__ = ["ProcessTree", "discard", "start_early", "take", "worker_argv"]
