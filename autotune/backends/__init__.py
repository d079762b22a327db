"""One module per hardware backend behind one small interface, probed lazily.

The host process only calls :meth:`Backend.host_accelerators`, which never initialises a device (an app may
``fork`` DataLoader workers after calling us, and a CUDA context in the parent breaks that). Everything else
runs in the calibration worker.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from autotune._models import Precision, Record


class Accelerator(Record):
    """What the host can see of an accelerator without initialising it, e.g. ``name='NVIDIA H200'``."""

    backend: str
    name: str
    driver: str | None = None


class Backend(ABC):
    """Availability, devices, precisions worth trying, synchronisation and OOM detection for one backend."""

    name: ClassVar[str]
    #: torch's device type for ``torch.autocast`` / ``torch.amp.GradScaler``
    device_type: ClassVar[str]

    @abstractmethod
    def host_accelerators(self) -> list[Accelerator]:
        """Cheap, side-effect-free facts for the fingerprint; must not initialise the device."""

    @abstractmethod
    def unusable_reason(self) -> str | None:
        """None when this backend can run candidates here; otherwise why not, in plain words."""

    @abstractmethod
    def devices(self) -> list[str]:
        """Device strings, one candidate each, e.g. ``['cuda:0', 'cuda:1']``."""

    @abstractmethod
    def precisions(self, device: str) -> list[Precision]:
        """The precisions worth measuring on ``device``; facts propose, measurement decides."""

    @abstractmethod
    def device_name(self, device: str) -> str:
        """Human name, e.g. ``'NVIDIA GeForce RTX 3090'``."""

    def synchronize(self, device: str) -> None:
        """Wait for queued work; a no-op on the CPU."""

    def reset_peak_memory(self, device: str) -> None:
        """Start a new peak-memory window where the backend tracks one."""

    def peak_memory_bytes(self, device: str) -> int | None:
        return None

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        # The CPU allocator reports exhaustion as a plain RuntimeError ("DefaultCPUAllocator: can't allocate").
        text = str(exc).lower()
        return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


@functools.cache
def all_backends() -> tuple[Backend, ...]:
    """Every backend, CPU first (it is the baseline and always available)."""
    from autotune.backends.cpu import CpuBackend
    from autotune.backends.cuda import CudaBackend
    from autotune.backends.mps import MpsBackend
    from autotune.backends.xpu import XpuBackend

    return (CpuBackend(), CudaBackend(), MpsBackend(), XpuBackend())


def backend_for(device: str) -> Backend:
    """The backend that owns a device string such as ``'cuda:1'``."""
    device_type = torch.device(device).type
    for backend in all_backends():
        if backend.device_type == device_type:
            return backend
    raise ValueError(f"no autotune backend for device {device!r}")


__all__ = ["Accelerator", "Backend", "all_backends", "backend_for"]
