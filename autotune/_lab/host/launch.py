"""Starting the worker's OS process, and starting it early: before the host has imported torch.

A worker start is an interpreter start, ``import torch`` and torch's first optimizer: seconds. ``python -m
autotune`` pays its own ``import torch`` before it knows what to measure; started first (:func:`start_early`),
the worker's start overlaps the host's import instead of following it, and the first
:class:`~autotune._lab.host.worker.Worker` that needs a process takes this one (:func:`take`). One nobody takes
(every family was cached, a usage error) is killed when the command ends (:func:`discard`) or the host exits.
A worker's output is read from its start (:class:`Launched`), taken or not: a chatty import must not fill a pipe
nobody reads (a few KiB on Windows) and stall the worker until the host takes it. This module imports nothing
from torch, nor anything that does: it runs before torch is loaded.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from autotune import _env
from autotune._cache.locks import held_elsewhere, measuring_lock
from autotune._errors import ConfigurationError
from autotune._lab import entry
from autotune._quota import usable_cores

if sys.platform == "win32":
    from autotune._lab.host._windows import ProcessTree
else:
    from autotune._lab.host._posix import ProcessTree


def worker_argv() -> list[str]:
    """How the host starts a worker: autotune's own entry point (never the app's main; in a frozen app, the app
    told to be the worker), and the host's pid (the worker dies with it)."""
    return entry.command(os.getpid())


class Launched:
    """``argv`` started as a process tree (see ``ProcessTree``), when, and its output as it comes: stdout's lines
    in ``lines`` (None at its end), the last lines of stderr in ``stderr_tail``."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.tree = ProcessTree(argv)
        self.launched = time.perf_counter()
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        proc = self.tree.proc
        self.readers = [
            threading.Thread(target=_pump, args=(proc.stdout, self.lines.put, lambda: self.lines.put(None)),
                             daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, self.stderr_tail.append, lambda: None), daemon=True),
        ]
        for reader in self.readers:
            reader.start()


#: the worker started early: at most one, until a Worker takes it
_early: list[Launched] = []
_registered: list[bool] = []  # the exit hook, once


def start_early() -> None:
    """Start a worker now, for the first :class:`Worker` of this process to take. Nothing when calibration runs
    in-process (or the setting is invalid: the command reports that), on a single core (the imports could not
    overlap, and a worker not needed would slow the host's down), while another process measures on this
    machine (a second ``import torch`` would skew its timings; the calibration then starts its worker when its
    turn comes) or when a process cannot be started (the worker then starts, and says why it cannot, when it is
    needed)."""
    try:
        if _early or _env.ISOLATION.get() != "subprocess" or usable_cores() < 2 or held_elsewhere(measuring_lock()):
            return
        argv = worker_argv()
    except ConfigurationError:
        return
    try:
        _early.append(Launched(argv))
    except OSError:
        return
    if not _registered:
        atexit.register(discard, os.getpid())
        _registered.append(True)


def take(argv: list[str]) -> Launched | None:
    """The worker started early, if it runs ``argv`` and is still running; it is then the caller's."""
    try:
        early = _early.pop()
    except IndexError:  # none, or another thread's Worker took it
        return None
    if argv == worker_argv() and early.tree.proc.poll() is None:
        return early
    _stop(early)
    return None


def discard(owner: int | None = None) -> None:
    """Kill the worker started early if no one took it (at exit: only in the process that started it, not in a
    forked child, ``owner``)."""
    if owner is not None and owner != os.getpid():
        return
    with contextlib.suppress(IndexError):
        while True:
            _stop(_early.pop())


def _pump(stream: TextIO | None, sink: Callable[[str], object], at_end: Callable[[], object]) -> None:
    if stream is not None:
        for line in stream:
            sink(line)
    at_end()


def _stop(launched: Launched) -> None:
    tree = launched.tree
    tree.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        tree.proc.wait(timeout=5)
    for reader in launched.readers:
        reader.join(timeout=5)
    for stream in (tree.proc.stdin, tree.proc.stdout, tree.proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


__all__ = ["Launched", "ProcessTree", "discard", "start_early", "take", "worker_argv"]
