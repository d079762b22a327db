"""The worker's process tree: one small module per platform, chosen once; the POSIX one for real, the Windows
one's job-object calls against a recording kernel32 (the OS boundary; Windows itself is not here)."""

from __future__ import annotations

import ctypes
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autotune._lab.host import _posix as _proc_posix
from autotune._lab.host import _windows as _proc_windows
from autotune._lab.host import launch

POSIX = pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")


def test_the_platform_module_is_chosen_once_by_sys_platform() -> None:
    expected = _proc_windows if sys.platform == "win32" else _proc_posix
    assert launch.ProcessTree is expected.ProcessTree


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited; only the reaping is left


PARENT_OF_A_SLEEPER = textwrap.dedent("""
    import subprocess, sys, time
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(sleeper.pid, flush=True)
    time.sleep(120)
""")


@POSIX
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_posix_kill_reaches_what_the_worker_started() -> None:
    tree = _proc_posix.ProcessTree([sys.executable, "-c", PARENT_OF_A_SLEEPER])
    assert tree.proc.stdout is not None
    grandchild = int(tree.proc.stdout.readline())
    assert os.getsid(tree.proc.pid) == tree.proc.pid != os.getsid(0), "a session (and process group) of its own"
    tree.kill()
    assert tree.proc.wait(timeout=30) < 0
    deadline = time.monotonic() + 30
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)
    tree.kill()  # a second kill of a gone tree is harmless


@POSIX
def test_posix_tree_speaks_text_over_pipes() -> None:
    tree = _proc_posix.ProcessTree([sys.executable, "-c", "print(input().upper())"])
    out, _ = tree.proc.communicate("ping\n", timeout=30)
    assert out == "PING\n"


def test_windows_job_limits_have_the_size_windows_expects() -> None:
    # JOBOBJECT_EXTENDED_LIMIT_INFORMATION: 144 bytes on 64-bit Windows, 112 on 32-bit; SetInformationJobObject
    # refuses any other length.
    assert ctypes.sizeof(_proc_windows._ExtendedLimits) == (144 if ctypes.sizeof(ctypes.c_void_p) == 8 else 112)


class RecordingKernel32:
    """kernel32's job-object calls, recorded; ``failing`` names the one call that returns FALSE/NULL."""

    def __init__(self, failing: str | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.failing = failing
        self.limit_flags: int | None = None

    def _call(self, name: str, result: int, *args: Any) -> int:
        self.calls.append((name, args))
        return 0 if name == self.failing else result

    def CreateJobObjectW(self, *args: Any) -> int:
        return self._call("CreateJobObjectW", 0x70, *args)

    def SetInformationJobObject(self, job: int, info_class: int, info: Any, size: int) -> int:
        self.limit_flags = info._obj.BasicLimitInformation.LimitFlags
        return self._call("SetInformationJobObject", 1, job, info_class, size)

    def OpenProcess(self, *args: Any) -> int:
        return self._call("OpenProcess", 0x90, *args)

    def AssignProcessToJobObject(self, *args: Any) -> int:
        return self._call("AssignProcessToJobObject", 1, *args)

    def CloseHandle(self, *args: Any) -> int:
        return self._call("CloseHandle", 1, *args)


def test_windows_worker_joins_a_job_that_kills_it_when_the_host_goes() -> None:
    kernel32 = RecordingKernel32()
    job = _proc_windows._job_holding(4242, kernel32)
    assert job == 0x70
    assert kernel32.limit_flags == 0x2000  # JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    assert kernel32.calls == [
        ("CreateJobObjectW", (None, None)),  # no security attributes: the worker cannot inherit the handle
        ("SetInformationJobObject", (0x70, 9, ctypes.sizeof(_proc_windows._ExtendedLimits))),
        ("OpenProcess", (0x0100 | 0x0001, False, 4242)),
        ("AssignProcessToJobObject", (0x70, 0x90)),
        ("CloseHandle", (0x90,)),  # the process handle only: the job's is held until the tree is gone
    ]


@pytest.mark.parametrize("failing", ["SetInformationJobObject", "OpenProcess", "AssignProcessToJobObject"])
def test_a_job_that_cannot_be_set_up_is_closed_and_refused(failing: str) -> None:
    kernel32 = RecordingKernel32(failing=failing)
    with pytest.raises(OSError, match=failing):
        _proc_windows._job_holding(4242, kernel32)
    assert kernel32.calls[-1] == ("CloseHandle", (0x70,))
