"""Windows: the worker in a job object that dies with the host, killed with everything it started.

Windows has no process groups to signal and does not reparent orphans, so the worker's watchdog (which
watches ``os.getppid()`` change) never fires there. A job object does both jobs: the host holds its only
handle (not inheritable), so when the host exits or is killed the kernel closes it and
``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`` terminates every process in the job; ``TerminateJobObject`` kills the
worker and anything it started. The worker runs a moment before it joins the job (it imports torch; it
starts nothing that early). Where no job can be made (Windows before 8 inside a job that forbids nesting),
the worker is killed alone with ``TerminateProcess``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import subprocess
import sys
import weakref

log = logging.getLogger("autotune")

_CREATE_NEW_PROCESS_GROUP = 0x00000200  # the host's Ctrl-C does not reach the worker; the host kills it
_JOB_OBJECT_EXTENDED_LIMIT_INFORMATION = 9  # JOBOBJECTINFOCLASS JobObjectExtendedLimitInformation
_JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
_PROCESS_SET_QUOTA = 0x0100
_PROCESS_TERMINATE = 0x0001


class _IoCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]


class _BasicLimits(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", ctypes.c_uint32),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),  # ULONG_PTR
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class _ExtendedLimits(ctypes.Structure):
    """JOBOBJECT_EXTENDED_LIMIT_INFORMATION (144 bytes on 64-bit Windows)."""

    _fields_ = [
        ("BasicLimitInformation", _BasicLimits),
        ("IoInfo", _IoCounters),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


@functools.cache
def _kernel32() -> ctypes.CDLL:
    if sys.platform != "win32":
        raise OSError("job objects exist only on Windows")
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # our own instance: its prototypes are ours
    handle = ctypes.c_void_p  # HANDLE is pointer-sized: the default int return type would truncate it
    kernel32.CreateJobObjectW.restype = handle
    kernel32.CreateJobObjectW.argtypes = (ctypes.c_void_p, ctypes.c_wchar_p)
    kernel32.SetInformationJobObject.argtypes = (handle, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
    kernel32.OpenProcess.restype = handle
    kernel32.OpenProcess.argtypes = (ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32)
    kernel32.AssignProcessToJobObject.argtypes = (handle, handle)
    kernel32.TerminateJobObject.argtypes = (handle, ctypes.c_uint32)
    kernel32.CloseHandle.argtypes = (handle,)
    return kernel32


def _failed(call: str) -> OSError:
    if sys.platform == "win32":
        code = ctypes.get_last_error()
        return OSError(None, f"{call}: {ctypes.FormatError(code).strip()}", None, code)
    return OSError(f"{call} failed")


def _job_holding(pid: int, kernel32: ctypes.CDLL) -> int:
    """A new job that kills its processes when its last handle closes, holding process ``pid``; its handle."""
    job = kernel32.CreateJobObjectW(None, None)  # no security attributes: the handle is not inherited
    if not job:
        raise _failed("CreateJobObjectW")
    try:
        limits = _ExtendedLimits()
        limits.BasicLimitInformation.LimitFlags = _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        if not kernel32.SetInformationJobObject(job, _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION, ctypes.byref(limits),
                                                ctypes.sizeof(limits)):
            raise _failed("SetInformationJobObject")
        process = kernel32.OpenProcess(_PROCESS_SET_QUOTA | _PROCESS_TERMINATE, False, pid)
        if not process:
            raise _failed("OpenProcess")
        try:
            if not kernel32.AssignProcessToJobObject(job, process):
                raise _failed("AssignProcessToJobObject")
        finally:
            kernel32.CloseHandle(process)
    except BaseException:
        kernel32.CloseHandle(job)
        raise
    return int(job)


class ProcessTree:
    """``argv`` started with piped text stdin/stdout/stderr in a new process group and a job of its own."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, creationflags=_CREATE_NEW_PROCESS_GROUP)
        self._job: int | None = None
        try:
            kernel32 = _kernel32()
            self._job = _job_holding(self.proc.pid, kernel32)
        except OSError as exc:
            log.debug("cannot put the worker in a job object (%s); it will be killed alone", exc)
            return
        # Closing the last handle kills what is left in the job: only once this tree is unreachable.
        weakref.finalize(self, kernel32.CloseHandle, self._job)

    def kill(self) -> None:
        """Terminate the job (the worker and anything it started), else the worker alone."""
        if self._job is not None and _kernel32().TerminateJobObject(self._job, 1):
            return
        with contextlib.suppress(OSError):  # TerminateProcess; it has exited already
            self.proc.kill()


__all__ = ["ProcessTree"]
