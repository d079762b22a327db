"""Intel GPUs (``xpu``)."""

from __future__ import annotations

import torch

from autotune._models import Precision
from autotune.backends import Accelerator, Backend


def _compiled() -> bool:
    return hasattr(torch, "xpu") and torch.xpu._is_compiled()


class XpuBackend(Backend):
    name = "xpu"
    device_type = "xpu"

    def host_accelerators(self) -> list[Accelerator]:
        if not _compiled():
            return []
        count = torch.xpu.device_count()
        return [Accelerator(backend="xpu", name=f"Intel XPU #{i}", driver=getattr(torch.version, "xpu", None)) for i in range(count)]

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
        return str(torch.xpu.get_device_name(torch.device(device)))

    def synchronize(self, device: str) -> None:
        torch.xpu.synchronize(torch.device(device))

    def reset_peak_memory(self, device: str) -> None:
        torch.xpu.reset_peak_memory_stats(torch.device(device))

    def peak_memory_bytes(self, device: str) -> int | None:
        return int(torch.xpu.max_memory_allocated(torch.device(device)))
