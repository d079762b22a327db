"""What identifies this machine's training speed, and nothing that identifies its user.

No hostname, user name, serial number, UUID or MAC address is read. The digest is a hash of the canonical
JSON of the fields, so any change in them (a GPU swap, a torch upgrade, a ``taskset`` with fewer cores)
selects a different results file, and swapping back finds the old one again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys

import torch
from pydantic import computed_field

from autotune._fp32 import current as current_fp32_settings
from autotune._models import Record
from autotune.backends import Accelerator, all_backends

#: Bumped when the meaning of stored measurements changes; part of the digest.
MEASUREMENT_VERSION = 2

_ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "neon", "asimd", "asimdhp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme",
)


class Fingerprint(Record):
    """The machine, e.g. ``cpu_brand='AMD EPYC', usable_cores=2, accelerators=[]``; ``digest`` keys the cache."""

    measurement_version: int
    os: str
    os_release: str
    arch: str
    python: str
    torch: str
    cuda: str | None
    hip: str | None
    cudnn: int | None
    cpu_brand: str
    cpu_isa: list[str]
    cpu_capability: str
    usable_cores: int
    ram_gib: int
    float32_matmul_precision: str
    accelerators: list[Accelerator]

    @computed_field  # type: ignore[prop-decorator]
    @functools.cached_property
    def digest(self) -> str:
        """16 hex digits of SHA-256 over the canonical JSON of every field above."""
        canonical = json.dumps(self.model_dump(exclude={"digest"}), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def summary(self) -> str:
        gpus = ", ".join(f"{a.name} ({a.backend})" for a in self.accelerators) or "no GPU"
        return (
            f"{self.cpu_brand}, {self.usable_cores} cores, {self.ram_gib} GiB; {gpus}; "
            f"torch {self.torch}, Python {self.python}, {self.os} {self.arch}"
        )


def _read_cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor block describes them all
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def _cpu() -> tuple[str, tuple[str, ...]]:
    if sys.platform == "linux":
        info = _read_cpuinfo()
        brand = info.get("model name") or info.get("Model") or info.get("Hardware") or platform.processor()
        flags = set((info.get("flags") or info.get("Features") or "").split())
    elif sys.platform == "darwin":
        brand = _sysctl("machdep.cpu.brand_string")
        flags = {"neon"} if platform.machine() == "arm64" else set()
        if _sysctl("hw.optional.arm.FEAT_BF16") == "1":  # M2 and later
            flags.add("bf16")
    else:
        brand, flags = platform.processor(), set()
    isa = tuple(flag for flag in _ISA_FLAGS if flag in flags)
    return brand or platform.machine() or "unknown CPU", isa


def cpu_brand() -> str:
    """e.g. ``'AMD EPYC'`` or ``'Apple M1'``"""
    return _cpu()[0]


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _ram_gib() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = _windows_ram_bytes()
    return max(1, round(total / 2**30))


def _windows_ram_bytes() -> int:
    import ctypes

    class MemoryStatus(ctypes.Structure):
        _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong), ("total_phys", ctypes.c_ulonglong),
                    ("avail_phys", ctypes.c_ulonglong), ("total_pagefile", ctypes.c_ulonglong),
                    ("avail_pagefile", ctypes.c_ulonglong), ("total_virtual", ctypes.c_ulonglong),
                    ("avail_virtual", ctypes.c_ulonglong), ("avail_extended", ctypes.c_ulonglong)]

    status = MemoryStatus()
    status.length = ctypes.sizeof(MemoryStatus)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
        return 0
    return int(status.total_phys)


@functools.cache
def _static_fields() -> dict[str, object]:
    brand, isa = _cpu()
    cudnn = None
    if torch.version.cuda is not None and torch.backends.cudnn.is_available():
        cudnn = torch.backends.cudnn.version()
    return {
        "measurement_version": MEASUREMENT_VERSION,
        "os": platform.system(),
        "os_release": platform.release(),
        "arch": platform.machine(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": cudnn,
        "cpu_brand": brand,
        "cpu_isa": list(isa),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ram_gib": _ram_gib(),
        "accelerators": [a for backend in all_backends() for a in backend.host_accelerators()],
    }


def fingerprint() -> Fingerprint:
    """This machine's fingerprint; hardware facts are read once per process, flags on every call."""
    # Process-level settings that change speed are re-read: an app may set them at any time.
    # Read through torch's per-backend API where it exists: the legacy getter raises once an app used it.
    return _fingerprint(_usable_cores(), current_fp32_settings().summary())


@functools.lru_cache(maxsize=8)
def _fingerprint(usable_cores: int, float32_matmul_precision: str) -> Fingerprint:
    return Fingerprint.model_validate(
        {**_static_fields(), "usable_cores": usable_cores, "float32_matmul_precision": float32_matmul_precision}
    )


__all__ = ["MEASUREMENT_VERSION", "Fingerprint", "cpu_brand", "fingerprint"]
