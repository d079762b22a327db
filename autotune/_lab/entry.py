"""The worker's entry point, and how a host starts it: ``python -m autotune._lab.entry HOST_PID``, and that of a copy
of the timed step running alongside it in a job of many processes (``... HOST_PID copies``).

In a frozen app (PyInstaller, cx_Freeze, Nuitka, Briefcase) ``sys.executable`` is the app itself, which runs the
app's main and knows no ``-m``: the worker is then the app started as ``APP --autotune-worker HOST_PID``, and
:func:`freeze_support` (called first in the entry point, or by autotune's PyInstaller runtime hook) turns that
process into the worker before the app's main runs. A host whose ``sys.executable`` is no Python at all (an
embedded interpreter) names one with ``AUTOTUNE_WORKER_PYTHON``.

Before anything heavy is imported (torch takes seconds), the worker keeps stdout for the protocol (anything else
that writes there goes to stderr), says :data:`HELLO` (the host then knows it runs autotune's code, of which
version) and ties its life to its host's, so that a host killed meanwhile never leaves it running, even mid-step:
on Linux the kernel's parent-death signal plus a check that ``HOST_PID`` is still its parent, on Linux and macOS a
watchdog thread that exits once the parent changes, on Windows the host's job object
(``autotune._lab.host._windows``). Only then does ``child`` (or ``copies``) run.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from pathlib import Path

from autotune import _env
from autotune._version import __version__

_WATCHDOG_PERIOD_S = 0.5
#: the argument a frozen app's worker is started with, in place of ``-m autotune._lab.entry``
WORKER_FLAG = "--autotune-worker"
#: the worker's first line on the protocol's stream, before it imports torch
HELLO = f"autotune-worker {__version__}"
#: the exit status of an app started as a worker that ran its own code instead (no freeze_support call)
EXIT_NOT_A_WORKER = 86
#: set once this process serves as a worker: the family code it imports may use autotune's API
_serving = threading.Event()
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?t?w?(_d)?(\.exe)?", re.IGNORECASE)


def frozen() -> bool:
    """Does ``sys.executable`` run the app rather than a Python that takes ``-m``? True in a frozen app
    (``sys.frozen``: PyInstaller, cx_Freeze, py2exe; ``__compiled__``: Nuitka) and under a launcher whose
    executable is not named like a Python (Briefcase's stub, an app embedding the interpreter)."""
    if getattr(sys, "frozen", False) or hasattr(sys.modules.get("__main__"), "__compiled__"):
        return True
    return not _PYTHON_NAME.fullmatch(Path(sys.executable).name)


def command(host_pid: int, *role: str) -> list[str]:
    """How to start an entry of this installation tied to ``host_pid``: the interpreter ``AUTOTUNE_WORKER_PYTHON``
    names, else the app's own executable with :data:`WORKER_FLAG` when frozen, else ``sys.executable -m``."""
    named = _env.WORKER_PYTHON.get()
    if named is not None:
        return [str(named), "-m", "autotune._lab.entry", str(host_pid), *role]
    if frozen():
        return [sys.executable, WORKER_FLAG, str(host_pid), *role]
    return [sys.executable, "-m", "autotune._lab.entry", str(host_pid), *role]


def set_worker_python(path: str | os.PathLike[str] | None) -> None:
    """Run calibration workers on the Python at ``path`` (None: autotune's own choice), e.g.
    ``autotune.set_worker_python(Path(app_dir) / "python" / "python.exe")``. Needed only where ``sys.executable`` is
    no Python and the app cannot be its own worker (an interpreter embedded in a native app); that Python must import
    autotune and torch. The same as ``AUTOTUNE_WORKER_PYTHON``, which this sets for this process and those it starts;
    raises ``ConfigurationError`` for a path with no file."""
    before = os.environ.pop(_env.WORKER_PYTHON.name, None)
    if path is None:
        return
    os.environ[_env.WORKER_PYTHON.name] = os.fspath(path)
    try:
        _env.WORKER_PYTHON.get()
    except BaseException:
        del os.environ[_env.WORKER_PYTHON.name]
        if before is not None:
            os.environ[_env.WORKER_PYTHON.name] = before
        raise


def started_as_worker(argv: list[str] | None = None) -> bool:
    """Was this process started as a frozen app's worker (``APP --autotune-worker HOST_PID``)? Its parent may be the
    host or, in a one-file app, the app's bootloader between them."""
    args = sys.argv if argv is None else argv
    return len(args) >= 3 and args[1] == WORKER_FLAG and args[2].isdigit()


def freeze_support() -> None:
    """Be the calibration worker and exit, when a frozen app was started as one; else return at once.

    Call it first in a frozen app's entry point, before the app does anything else, as
    ``multiprocessing.freeze_support()`` is called: ``if __name__ == "__main__": autotune.freeze_support()``.
    PyInstaller builds need no call (autotune's hook runs it before the app's main).
    """
    if started_as_worker():
        serve(int(sys.argv[2]), sys.argv[3:])


def not_a_worker() -> None:
    """Exit now when this process is an app started as a worker that went on to its own code: the app's main
    would otherwise run a second time and wait for its own host. Said on stderr, which the host reports."""
    if started_as_worker() and not _serving.is_set():
        sys.stderr.write(
            "autotune: this process was started as autotune's calibration worker, but the app ran its own code "
            "instead; call autotune.freeze_support() first in the app's entry point\n")
        sys.stderr.flush()
        os._exit(EXIT_NOT_A_WORKER)


def die_with_the_host(host_pid: int) -> None:
    """Exit when the host ``host_pid`` is gone: now if it is already, else as soon as it goes. The host is the
    parent, or (a one-file frozen app) the parent's parent: its bootloader unpacks the app, then runs it as a child."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills us when the parent thread dies
    if sys.platform == "win32":  # the host's job object kills every process in it when the host goes
        return
    parent = os.getppid() == host_pid

    def gone() -> bool:
        # A parent that died changes getppid() (no pid reuse can fool it); a host further up is asked directly.
        return os.getppid() != host_pid if parent else not _alive(host_pid)

    if gone():
        os._exit(1)  # the host died before we could watch it: nobody will read our results

    def watchdog() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if gone():
                os._exit(1)  # the host is gone: nobody will read our results

    threading.Thread(target=watchdog, name="autotune-watchdog", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # POSIX: a signal that is never sent, only checked (PermissionError: it exists)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def serve(host_pid: int, role: list[str]) -> None:
    """Run the worker (or, with ``role == ["copies"]``, a copy of the timed step) for ``host_pid``; never returns."""
    _serving.set()
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")  # line-buffered: each line is flushed
    os.dup2(2, 1)  # print() and C-level writes (imports, model code) go to stderr, not into the protocol
    sys.stdout = sys.stderr
    protocol.write(HELLO + "\n")
    die_with_the_host(host_pid)
    import importlib

    room = "autotune._lab.copies" if role == ["copies"] else "autotune._lab.child"
    code = importlib.import_module(room).main(protocol)
    sys.stderr.flush()
    # Everything is reported; skip the interpreter's teardown (torch's is slow), which the host would wait for.
    os._exit(code)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
