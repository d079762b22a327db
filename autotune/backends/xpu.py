"""Intel GPUs (``xpu``).

The host lists them from sysfs (PCI vendor 0x8086, display class), never through ``torch.xpu``, which starts
the Level Zero runtime. sysfs has no marketing name, so a GPU is named by its PCI ids, e.g.
``'Intel GPU 8086:56a0'`` (an Arc A770), and its kernel driver (``i915`` or ``xe``) is part of the driver field.
"""

from __future__ import annotations

import glob
import os
import sys

import torch

from autotune._records import Precision
from autotune.backends.api import Accelerator, Backend, StepClock


def _compiled() -> bool:
    return hasattr(torch, "xpu") and torch.xpu._is_compiled()


_SYSFS_PCI = "/sys/bus/pci/devices"


def sysfs_gpus(root: str = _SYSFS_PCI) -> list[tuple[str, str | None]]:
    """(name, kernel driver) of each Intel display device, in PCI bus order."""
    found = []
    for device in sorted(glob.glob(f"{root}/*")):
        try:
            with open(f"{device}/vendor", encoding="ascii") as f:
                vendor = f.read().strip()
            with open(f"{device}/class", encoding="ascii") as f:
                pci_class = f.read().strip()
            with open(f"{device}/device", encoding="ascii") as f:
                device_id = f.read().strip()
        except OSError:
            continue
        if vendor.lower() != "0x8086" or not pci_class.startswith("0x03"):  # 0x03: display controllers
            continue
        driver = os.path.basename(os.path.realpath(f"{device}/driver")) if os.path.exists(f"{device}/driver") else None
        found.append((f"Intel GPU 8086:{device_id.lower().removeprefix('0x')}", driver))
    return found


def visible_indices(count: int, ze_affinity_mask: str | None) -> list[int]:
    """The devices ``ZE_AFFINITY_MASK`` leaves visible, e.g. ``'1,0.1'`` -> ``[1, 0]`` (sub-devices: their card).

    An empty mask is read as unset; either way the raw value is part of the fingerprint.
    """
    if not ze_affinity_mask:
        return list(range(count))
    chosen: list[int] = []
    for entry in ze_affinity_mask.split(","):
        root = entry.strip().split(".")[0]
        if not root.isdigit() or int(root) >= count:
            continue  # Level Zero ignores entries that name no device
        if int(root) not in chosen:
            chosen.append(int(root))
    return chosen


class XpuBackend(Backend):
    name = "xpu"
    title = "Intel XPU"
    device_type = "xpu"
    async_copies = True
    asynchronous = True
    lightning_accelerator = None
    visible_device_variables = ("ZE_AFFINITY_MASK",)

    def __init__(self) -> None:
        #: whether this torch build times XPU events (2.6 and later); None until first asked
        self._timed_events: bool | None = None
        #: (allocated, reserved) bytes live on each device when its peak window started
        self._live: dict[str, tuple[int, int]] = {}

    def host_accelerators(self) -> list[Accelerator]:
        if not _compiled() or sys.platform != "linux":
            return []  # elsewhere the model cannot be read without starting the runtime; the env vars still count
        gpus = sysfs_gpus()
        runtime = getattr(torch.version, "xpu", None)
        return [
            Accelerator(backend="xpu", name=gpus[i][0], driver=" ".join(filter(None, (gpus[i][1], runtime))) or None)
            for i in visible_indices(len(gpus), os.environ.get("ZE_AFFINITY_MASK"))
        ]

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

    def profiler_activity(self) -> torch.profiler.ProfilerActivity | None:
        return torch.profiler.ProfilerActivity.XPU

    def synchronize(self, device: str) -> None:
        torch.xpu.synchronize(torch.device(device))

    def step_clock(self, device: str) -> StepClock | None:
        stream = torch.xpu.current_stream(torch.device(device))
        clock = StepClock(lambda: torch.xpu.Event(enable_timing=True), lambda event: event.record(stream))
        if self._timed_events is None:
            try:  # builds before torch 2.6 raise on elapsed_time
                clock.mark()
                clock.mark()
                self.synchronize(device)
                clock.intervals_s()
                self._timed_events = True
            except (RuntimeError, NotImplementedError):
                self._timed_events = False
            clock = StepClock(lambda: torch.xpu.Event(enable_timing=True), lambda event: event.record(stream))
        return clock if self._timed_events else None

    def release_cached_memory(self, device: str) -> None:
        torch.xpu.empty_cache()

    def reset_peak_memory(self, device: str) -> None:
        where = torch.device(device)
        torch.xpu.empty_cache()
        torch.xpu.reset_peak_memory_stats(where)
        self._live[device] = (int(torch.xpu.memory_allocated(where)), int(torch.xpu.memory_reserved(where)))

    def peak_memory_bytes(self, device: str) -> int | None:
        return int(torch.xpu.max_memory_allocated(torch.device(device))) - self._live.get(device, (0, 0))[0]

    def peak_reserved_bytes(self, device: str) -> int | None:
        return int(torch.xpu.max_memory_reserved(torch.device(device))) - self._live.get(device, (0, 0))[1]

    def free_memory_bytes(self, device: str) -> int | None:
        """Free on the device plus the allocator's cached, unused blocks; None on torch builds without
        ``torch.xpu.mem_get_info``."""
        mem_get_info = getattr(torch.xpu, "mem_get_info", None)
        if mem_get_info is None:
            return None
        where = torch.device(device)
        free, _ = mem_get_info(where)
        return int(free + torch.xpu.memory_reserved(where) - torch.xpu.memory_allocated(where))
