"""POSIX (Linux, macOS): the worker in a session of its own, killed with everything it started.

``start_new_session`` makes the worker the leader of a new process group, so ``killpg`` reaches the
processes a candidate starts too (a compiler, a data loader), and a Ctrl-C in the host's terminal reaches
only the host, which then kills the worker itself. That the worker dies with a killed host is the worker's
own business from its first instruction (``entry``: parent-death signal on Linux, a watchdog on
``os.getppid()`` on Linux and macOS).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

assert sys.platform != "win32", "POSIX only: process.py imports _windows there"  # and mypy skips it there


class ProcessTree:
    """``argv`` started with piped text stdin/stdout/stderr as the leader of a new process group."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL the process group: the worker and anything it started."""
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
            os.killpg(self.proc.pid, signal.SIGKILL)


__all__ = ["ProcessTree"]
