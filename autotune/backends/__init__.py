"""One module per hardware backend behind one small interface (``api.Backend``), probed lazily. A new backend
is its module, its entry in :func:`all_backends` and its ``prefer`` word (``autotune._variants.Prefer``):
the rest of the package asks the interface and names no backend (``tests/unit/test_tables.py``).

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


def usable_devices() -> list[str]:
    """The devices this process can train on, e.g. ``['cpu', 'cuda:0', 'cuda:1']``, without initialising any."""
    return [device for backend in all_backends() if backend.unusable_reason() is None for device in backend.devices()]


def resolve_device(word: str) -> str:
    """The device a device word names, validated against what this process can use: ``'cpu'`` (``'cpu:0'`` too),
    ``'gpu'`` (the first usable accelerator), a backend (``'cuda'`` -> ``'cuda:0'``) or one of its devices
    (``'cuda:1'``, ``'mps'``). Raises LookupError saying what this process can use instead; initialises no device."""
    wanted = word.strip().lower()
    cpu, *accelerators = all_backends()
    if wanted == "gpu":
        for backend in accelerators:
            if backend.unusable_reason() is None and backend.devices():
                return backend.devices()[0]
        notes = "; ".join(f"{b.name}: {b.unusable_reason()}" for b in accelerators)
        raise LookupError(f"there is no usable GPU here ({notes}); this process can use: {', '.join(usable_devices())}")
    try:
        device = torch.device(wanted)
    except (RuntimeError, ValueError):
        device = None
    owner = next((b for b in all_backends() if device is not None and b.device_type == device.type), None)
    if device is None or owner is None:
        raise LookupError(f"not a device: cpu, gpu, {', '.join(b.name for b in accelerators)} or one of their devices "
                          f"(cuda:1); this process can use: {', '.join(usable_devices())}")
    if owner is cpu:
        return "cpu"
    why = owner.unusable_reason()
    devices = owner.devices() if why is None else []
    if device.index is None and devices:
        return devices[0]
    named = f"{device.type}:{device.index}"
    for found in devices:
        if found == named or (device.index == 0 and found == device.type):
            return found
    what = why or f"{owner.title} devices here: {', '.join(devices) or 'none'}"
    raise LookupError(f"{wanted} is not usable ({what}); this process can use: {', '.join(usable_devices())}")


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


__all__ = ["Accelerator", "Backend", "ClockReading", "Finding", "all_backends", "backend_for", "diagnose",
           "resolve_device", "usable_devices"]
