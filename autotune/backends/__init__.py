"""One module per hardware backend behind one small interface (``api.Backend``), probed lazily. A new backend
is its module plus one line in :func:`all_backends`: the rest of the package asks the interface.

The host process only calls what never initialises a device (:meth:`Backend.host_accelerators` and the class
facts): an app may ``fork`` DataLoader workers after calling us, and a CUDA context in the parent breaks that.
Everything else runs in the calibration worker (or in ``--doctor``).
"""

from __future__ import annotations

import functools

import torch

from autotune.backends.api import Accelerator, Backend, ClockReading, Finding
from autotune.backends.cpu import CpuBackend
from autotune.backends.cuda import CudaBackend
from autotune.backends.mps import MpsBackend
from autotune.backends.xpu import XpuBackend


@functools.cache
def all_backends() -> tuple[Backend, ...]:
    """Every backend, CPU first (it is the baseline and always available)."""
    return (CpuBackend(), CudaBackend(), MpsBackend(), XpuBackend())


def backend_for(device: str) -> Backend:
    """The backend that owns a device string such as ``'cuda:1'``."""
    device_type = torch.device(device).type
    for backend in all_backends():
        if backend.device_type == device_type:
            return backend
    raise ValueError(f"no autotune backend for device {device!r}")


__all__ = ["Accelerator", "Backend", "ClockReading", "Finding", "all_backends", "backend_for"]
