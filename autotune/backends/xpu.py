"""Intel GPUs (``xpu``).

The fingerprint names each card without initialising the device: on Linux from sysfs (PCI device id, which
tells an Arc A770 from an A380, and the kernel driver, ``i915`` or ``xe``); elsewhere (Windows: no ``fork``
there to break) from torch's device properties, which carry the marketing name and the driver version.
"""

from __future__ import annotations

import glob
import os
import re
import sys

import torch

from autotune._models import Precision
from autotune.backends import Accelerator, Backend

_DRM = "/sys/class/drm"
_INTEL_VENDOR = "0x8086"
_DISPLAY_CLASS = "0x03"  # PCI class 0x03xxxx: display controllers (the GPU, not Intel's other PCI devices)


def _compiled() -> bool:
    return hasattr(torch, "xpu") and torch.xpu._is_compiled()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def intel_gpus(drm_dir: str = _DRM, modules_dir: str = "/sys/module") -> list[Accelerator]:
    """Intel display devices in sysfs card order, e.g. ``name='Intel GPU 0x56a0', driver='xe'``."""
    cards = [p for p in glob.glob(f"{drm_dir}/card*") if re.fullmatch(r"card\d+", os.path.basename(p))]
    found = []
    for card in sorted(cards, key=lambda p: int(os.path.basename(p)[4:])):
        device = f"{card}/device"
        if _read(f"{device}/vendor") != _INTEL_VENDOR or not (_read(f"{device}/class") or "").startswith(_DISPLAY_CLASS):
            continue
        try:
            driver = os.path.basename(os.readlink(f"{device}/driver"))
        except OSError:
            driver = "no driver"
        version = _read(f"{modules_dir}/{driver}/version")  # out-of-tree (DKMS) drivers have one
        found.append(Accelerator(backend="xpu", name=f"Intel GPU {_read(f'{device}/device') or 'unknown'}",
                                 driver=f"{driver} {version}" if version else driver))
    return found


class XpuBackend(Backend):
    name = "xpu"
    device_type = "xpu"

    def host_accelerators(self) -> list[Accelerator]:
        if not _compiled():
            return []
        if sys.platform == "linux":
            return intel_gpus()
        found = []
        for index in range(torch.xpu.device_count()):
            props = torch.xpu.get_device_properties(index)
            found.append(Accelerator(backend="xpu", name=str(props.name), driver=str(props.driver_version)))
        return found

    def unusable_reason(self) -> str | None:
        if not _compiled():
            return "this torch build has no XPU support"
        if not torch.xpu.is_available():
            return "XPU support is built but no Intel GPU is available"
        return None

    def devices(self) -> list[str]:
        return [f"xpu:{i}" for i in range(torch.xpu.device_count())]

    def precisions(self, device: str) -> list[Precision]:
        return ["fp32", "bf16-mixed", "fp16-mixed"]

    def device_name(self, device: str) -> str:
        props = torch.xpu.get_device_properties(torch.device(device))
        return f"{props.name}, driver {props.driver_version}, {props.total_memory / 2**30:.0f} GiB"

    def synchronize(self, device: str) -> None:
        torch.xpu.synchronize(torch.device(device))

    def reset_peak_memory(self, device: str) -> None:
        torch.xpu.reset_peak_memory_stats(torch.device(device))

    def peak_memory_bytes(self, device: str) -> int | None:
        return int(torch.xpu.max_memory_allocated(torch.device(device)))
