"""The CPU: always available, the fp32 baseline every other candidate is compared with.

Also the CPU's facts for the fingerprint (brand and ISA flags), read from ``/proc/cpuinfo`` on Linux, ``sysctl``
on macOS and the registry on Windows; the platform parsing lives in ``_darwin`` and ``_windows``.
"""

from __future__ import annotations

import functools
import platform
import sys
import warnings

import torch

from autotune._quota import memory_headroom_bytes
from autotune._records import Precision
from autotune.backends import _darwin, _linux, _windows
from autotune.backends.api import Accelerator, Backend

_ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "neon", "asimd", "asimdhp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme",
)


def read_cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor block of ``/proc/cpuinfo`` (it describes them all), e.g. ``{'model name': ...}``."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def cpu_facts() -> tuple[str, tuple[str, ...]]:
    """The CPU's brand and the ISA flags that matter for training speed, e.g. ``('Apple M2', ('neon', 'bf16'))``."""
    flags: set[str]
    if sys.platform == "linux":
        info = read_cpuinfo()
        brand = info.get("model name") or info.get("Model") or info.get("Hardware") or platform.processor()
        flags = set((info.get("flags") or info.get("Features") or "").split())
    elif sys.platform == "darwin":
        brand, flags = _darwin.apple_cpu(_darwin.read_sysctl(), platform.machine())
    elif sys.platform == "win32":
        brand, flags = _windows.cpu_name() or platform.processor(), set()
    else:
        brand, flags = platform.processor(), set()
    isa = tuple(flag for flag in _ISA_FLAGS if flag in flags)
    return brand or platform.machine() or "unknown CPU", isa


def cpu_brand() -> str:
    """e.g. ``'AMD EPYC'`` or ``'Apple M1'``"""
    return cpu_facts()[0]


def _cpu_autocast_works(dtype: torch.dtype) -> bool:
    # An unsupported CPU autocast dtype only warns and disables itself, so check that it really switched on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=dtype):
            return torch.is_autocast_enabled("cpu")


class CpuBackend(Backend):
    name = "cpu"
    title = "the CPU"
    device_type = "cpu"
    lightning_accelerator = "cpu"

    def host_accelerators(self) -> list[Accelerator]:
        return []

    def unusable_reason(self) -> str | None:
        return None

    def devices(self) -> list[str]:
        return ["cpu"]

    def precisions(self, device: str) -> list[Precision]:
        found: list[Precision] = ["fp32"]
        if _cpu_autocast_works(torch.bfloat16):
            found.append("bf16-mixed")
        if _cpu_autocast_works(torch.float16):
            found.append("fp16-mixed")
        return found

    def __init__(self) -> None:
        #: the resident size when the current peak window started; None: no window (not Linux, or refused)
        self._baseline_bytes: int | None = None

    def device_name(self, device: str) -> str:
        return f"{cpu_brand()}, {torch.get_num_threads()} threads"

    def release_cached_memory(self, device: str) -> None:
        if sys.platform == "linux":
            _linux.return_free_heap()

    def reset_peak_memory(self, device: str) -> None:
        """Start a peak window at the live set: free heap pages go back first, so the resident size is what
        is in use, and what the next candidate allocates raises it (see ``_linux.return_free_heap``)."""
        self._baseline_bytes = None
        if sys.platform != "linux":
            return
        _linux.return_free_heap()
        if _linux.reset_peak_resident():
            resident = _linux.resident_bytes()
            self._baseline_bytes = resident[0] if resident is not None else None

    def peak_memory_bytes(self, device: str) -> int | None:
        """What the process's peak resident size rose by since ``reset_peak_memory``: the candidate's own
        model, optimizer state, gradients, activations and batch, not the interpreter and torch around them
        (as a GPU's allocated peak leaves out its context). None where the OS gives no resettable peak."""
        if self._baseline_bytes is None:
            return None
        resident = _linux.resident_bytes()
        return None if resident is None else max(0, resident[1] - self._baseline_bytes)

    def free_memory_bytes(self, device: str) -> int | None:
        """The RAM new allocations can get without swapping (``MemAvailable``), or less where the process's
        cgroup holds it to less (a container's memory limit: its ``/proc/meminfo`` is the host's); None off Linux."""
        if sys.platform != "linux":
            return None
        known = [b for b in (_linux.available_bytes(), memory_headroom_bytes()) if b is not None]
        return min(known, default=None)
