"""One module per hardware backend behind one small interface (``api.Backend``), probed lazily. A new backend
is its module plus one line in :func:`all_backends`: the rest of the package asks the interface.

The host process only calls what never initialises a device (:meth:`Backend.host_accelerators` and the class
facts): an app may ``fork`` DataLoader workers after calling us, and a CUDA context in the parent breaks that.
Everything else runs in the calibration worker (or in ``--doctor``: :func:`diagnose`).
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


def diagnose() -> list[Finding]:
    """``python -m autotune --doctor``: each usable accelerator, then what each backend finds wrong here (GPU
    hardware this torch build cannot use, settings that skew timing); the CPU when no GPU is usable. It runs in
    the CLI's own process, so unlike the library's host path it may initialise devices."""
    cpu, *accelerators = all_backends()
    findings: list[Finding] = []
    usable = []
    for backend in accelerators:
        reason = backend.unusable_reason()
        if reason is None:
            names = [backend.device_name(d) for d in backend.devices()]
            usable += names
            findings += [Finding(level="ok", message=f"{backend.name}: {name}") for name in names]
    for backend in all_backends():
        findings += backend.diagnose()
    if not usable:
        findings.append(Finding(
            level="info",
            message=f"no usable GPU on this machine: training runs on the CPU ({cpu.device_name('cpu')})",
        ))
    return findings


__all__ = ["Accelerator", "Backend", "ClockReading", "Finding", "all_backends", "backend_for", "diagnose"]
