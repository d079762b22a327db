"""What a Config means to torch: the autocast dtype, the GradScaler default, the tf32 switch, the layout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from autotune._models import Precision

AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "bf16-mixed": torch.bfloat16,
    "fp16-mixed": torch.float16,
}

#: GradScaler's own default; lower values are tried when it skips steps (BACKGROUND.md fact 5).
DEFAULT_INIT_SCALE = 65536.0


@contextlib.contextmanager
def precision_context(precision: Precision) -> Iterator[None]:
    """tf32 is a process-wide matmul setting, so it is switched on only around the steps that use it."""
    if precision != "tf32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def move(tensor: torch.Tensor, device: torch.device, memory_format: torch.memory_format) -> torch.Tensor:
    """A batch tensor on the device; 4-D tensors (images) in the requested memory format."""
    if tensor.dim() == 4 and memory_format is not torch.contiguous_format:
        return tensor.to(device, memory_format=memory_format, non_blocking=True)
    return tensor.to(device, non_blocking=True)


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE", "MEMORY_FORMATS", "move", "precision_context"]
