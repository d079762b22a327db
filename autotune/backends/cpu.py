"""The CPU: always available, the fp32 baseline every other candidate is compared with."""

from __future__ import annotations

import warnings

import torch

from autotune._models import Precision
from autotune.backends import Accelerator, Backend


def _cpu_autocast_works(dtype: torch.dtype) -> bool:
    # An unsupported CPU autocast dtype only warns and disables itself, so check that it really switched on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=dtype):
            return torch.is_autocast_enabled("cpu")


class CpuBackend(Backend):
    name = "cpu"
    device_type = "cpu"

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

    def device_name(self, device: str) -> str:
        from autotune._fingerprint import cpu_brand

        return f"{cpu_brand()}, {torch.get_num_threads()} threads"
