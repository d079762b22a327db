"""``python -m autotune --doctor``: GPU hardware this torch build cannot use, and settings that skew timing.

It runs in the CLI's own process, so unlike the library's host path it may initialise devices.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Literal

import torch

from autotune._models import Record
from autotune.backends import all_backends
from autotune.backends.cpu import cpu_brand
from autotune.backends.cuda import nvidia_driver_version, nvidia_hardware_present
from autotune.backends.mps import FALLBACK_VAR


class Finding(Record):
    """One diagnosis, e.g. ``level='error', message='NVIDIA driver found but ...', fix='install ...'``."""

    level: Literal["ok", "info", "warning", "error"]
    message: str
    fix: str | None = None


def diagnose() -> list[Finding]:
    findings: list[Finding] = []
    usable = []
    for backend in all_backends()[1:]:
        reason = backend.unusable_reason()
        if reason is None:
            names = [backend.device_name(d) for d in backend.devices()]
            usable += names
            findings += [Finding(level="ok", message=f"{backend.name}: {name}") for name in names]
    build = torch.__version__
    if torch.version.cuda is None and torch.version.hip is None and nvidia_hardware_present():
        driver = nvidia_driver_version()
        findings.append(Finding(
            level="error",
            message=f"an NVIDIA driver{f' {driver}' if driver else ''} is installed but torch {build} has no CUDA "
            "support: training will run on the CPU",
            fix="install a CUDA build of torch that matches the driver, then run `python -m autotune --recalibrate`",
        ))
    if torch.version.cuda is not None and not torch.cuda.is_available():
        driver = nvidia_driver_version()
        findings.append(Finding(
            level="error",
            message=f"torch {build} was built for CUDA {torch.version.cuda} but finds no usable GPU"
            + (f" (driver {driver})" if driver else " (no NVIDIA driver found)"),
            fix="update the NVIDIA driver to one that supports this CUDA version, or install a torch build for "
            "an older CUDA; check that CUDA_VISIBLE_DEVICES does not hide the GPU",
        ))
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        findings.append(Finding(level="warning", message="CUDA_VISIBLE_DEVICES is empty: every CUDA GPU is hidden",
                                fix="unset CUDA_VISIBLE_DEVICES"))
    if sys.platform == "darwin" and platform.machine() == "arm64":
        if not torch.backends.mps.is_built():
            findings.append(Finding(level="error", message=f"Apple Silicon, but torch {build} was built without MPS",
                                    fix="install the standard macOS arm64 torch wheel"))
        elif not torch.backends.mps.is_available():
            findings.append(Finding(level="error", message="Apple Silicon, MPS built but not available",
                                    fix="update macOS to 12.3 or later and use a native arm64 Python (not Rosetta)"))
    if os.environ.get(FALLBACK_VAR) == "1":
        findings.append(Finding(
            level="warning",
            message=f"{FALLBACK_VAR}=1: ops MPS lacks run on the CPU, and calibration would time them as GPU work",
            fix=f"unset {FALLBACK_VAR} before calibrating, or accept that MPS timings include CPU fallbacks",
        ))
    if not usable:
        findings.append(Finding(
            level="info",
            message=f"no usable GPU on this machine: training runs on the CPU ({cpu_brand()}, "
            f"{torch.get_num_threads()} threads)",
        ))
    return findings


__all__ = ["Finding", "diagnose"]
