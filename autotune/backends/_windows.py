"""Windows facts for the fingerprint: the CPU's marketing name and the installed memory.

``platform.processor()`` on Windows is ``'Intel64 Family 6 Model 158 Stepping 10, GenuineIntel'``, which names
a family, not a CPU; the registry holds the name the vendor gave it.
"""

from __future__ import annotations

import ctypes
import sys

_CPU_KEY = r"HARDWARE\DESCRIPTION\System\CentralProcessor\0"


def cpu_name() -> str:
    """e.g. ``'Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz'``; '' when the registry cannot be read."""
    if sys.platform != "win32":
        return ""
    import winreg

    try:
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, _CPU_KEY) as key:
            value, _ = winreg.QueryValueEx(key, "ProcessorNameString")
    except OSError:
        return ""
    return clean_cpu_name(str(value))


def clean_cpu_name(value: str) -> str:
    """Registry names are padded with spaces (and some with NULs): ``' Intel(R) ... '`` -> ``'Intel(R) ...'``"""
    return " ".join(value.replace("\x00", " ").split())


def ram_bytes() -> int:
    """Installed physical memory from ``GlobalMemoryStatusEx``; 0 when it cannot be read."""
    if sys.platform != "win32":
        return 0

    class MemoryStatus(ctypes.Structure):
        _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong), ("total_phys", ctypes.c_ulonglong),
                    ("avail_phys", ctypes.c_ulonglong), ("total_pagefile", ctypes.c_ulonglong),
                    ("avail_pagefile", ctypes.c_ulonglong), ("total_virtual", ctypes.c_ulonglong),
                    ("avail_virtual", ctypes.c_ulonglong), ("avail_extended", ctypes.c_ulonglong)]

    status = MemoryStatus()
    status.length = ctypes.sizeof(MemoryStatus)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        return 0
    return int(status.total_phys)


__all__ = ["clean_cpu_name", "cpu_name", "ram_bytes"]
