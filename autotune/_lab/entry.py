"""The worker's entry point: ``python -m autotune._lab.entry HOST_PID``.

Its first instructions tie the worker's life to its host's, before anything heavy is imported: ``import torch``
and the calibration's modules take seconds, and a host killed meanwhile must not leave its worker running.
On Linux the kernel sends the worker SIGKILL when the host dies (``PR_SET_PDEATHSIG``), and since the host may
have died before that was armed, the worker then checks that ``HOST_PID`` is still its parent. On Linux and
macOS a watchdog thread exits within a second of the host going away (``os.getppid()`` changes when the orphan
is reparented; no ``/proc``), even while a step is running, so a hung GPU candidate never outlives the app.
Windows does not reparent: there the host's job object kills the worker (``autotune._worker._windows``).
Only then is the worker itself (``child``) loaded and run.
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
    from autotune._lab import child

    code = child.main()
    sys.stderr.flush()
    # Everything is reported; skip the interpreter's teardown (torch's takes ~0.5 s) that the host would wait for.
    os._exit(code)
