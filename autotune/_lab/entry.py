"""The worker's entry point: ``python -m autotune._lab.entry HOST_PID``, and that of a copy of the timed step
running alongside it in a job of many processes: ``python -m autotune._lab.entry WORKER_PID copies`` (``copies``).

Before anything heavy is imported (torch takes seconds), the worker ties its life to its host's, so that a host
killed meanwhile never leaves it running, even mid-step: on Linux the kernel's parent-death signal plus a check
that ``HOST_PID`` is still its parent, on Linux and macOS a watchdog thread that exits once the parent changes,
on Windows the host's job object (``autotune._worker._windows``). Only then does ``child`` (or ``copies``) run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

_WATCHDOG_PERIOD_S = 0.5


def die_with_the_host(host_pid: int) -> None:
    """Exit when the host ``host_pid`` is gone: now if it is already, else as soon as it goes."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills us when the host thread dies
    if os.getppid() != host_pid:
        os._exit(1)  # the host died before we could watch it: nobody will read our results
    if sys.platform == "win32":
        return

    def watchdog() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if os.getppid() != host_pid:
                os._exit(1)  # the host is gone: nobody will read our results

    threading.Thread(target=watchdog, name="autotune-watchdog", daemon=True).start()


if __name__ == "__main__":
    die_with_the_host(int(sys.argv[1]))
    import importlib

    room = "autotune._lab.copies" if sys.argv[2:] == ["copies"] else "autotune._lab.child"
    code = importlib.import_module(room).main()
    sys.stderr.flush()
    # Everything is reported; skip the interpreter's teardown (torch's is slow), which the host would wait for.
    os._exit(code)
