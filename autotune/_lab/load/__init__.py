"""What the operating system says about the worker's own process while candidates are timed, and what the worker
does so that its own threads do not pass for a busy machine.

:func:`settle` pauses, on the CPU, until this process's other threads stop running. OpenMP's thread pool
spin-waits after every parallel region (GNU libgomp, which torch's CPU wheels use: ``GOMP_SPINCOUNT``, by default
300,000 spins, a few milliseconds), and a pool thread spinning on the same physical core (a hyper-threaded
sibling: a 2-vCPU cloud machine is one core) slows the control measured right after an all-thread candidate, but
not after a one-thread one. A thread that sleeps instead wakes up slower.

Linux reads ``/proc`` (``_proc``); elsewhere the operating system says nothing (None), and the pause is its
minimum alone.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from autotune._lab.load.api import Reader

#: the longest :func:`settle` waits for this process's threads to stop running: a spin counted in iterations
#: lasts longer on a loaded machine; Intel's OpenMP spins 200 ms by default (``KMP_BLOCKTIME``), and the control
#: is then measured beside a spinning pool, after every candidate alike
SETTLE_MAX_S = 0.05


@functools.cache
def reader() -> Reader | None:
    """This platform's reader, chosen once: ``/proc`` on Linux."""
    if sys.platform.startswith("linux") and os.path.exists("/proc/self/task"):
        from autotune._lab.load import _proc

        return _proc
    return None


def settle(seconds: float) -> None:
    """Pause ``seconds`` on the CPU, then until this process's other threads stop running (a thread pool
    spin-waiting after a candidate's parallel region; at most :data:`SETTLE_MAX_S`): the control that follows
    measures the machine, not the candidate before it. Where thread states cannot be read, the pause alone."""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        pass
    source = reader()
    while time.perf_counter() - started < SETTLE_MAX_S and source is not None and source.threads_running():
        pass


__all__ = ["SETTLE_MAX_S", "Reader", "reader", "settle"]
