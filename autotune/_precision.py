"""What a Config means to torch: the autocast dtype, the GradScaler default, the layout, the batch copy.

The fp32 / tf32 settings live in :mod:`autotune._fp32`.
"""

from __future__ import annotations

import functools

import torch

from autotune._records import Precision
from autotune.backends import all_backends

AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "bf16-mixed": torch.bfloat16,
    "fp16-mixed": torch.float16,
}

#: GradScaler's own default; calibration tries lower ones when fp16 steps overflow at it and are skipped.
DEFAULT_INIT_SCALE = 65536.0


MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@functools.cache
def _async_copy_targets() -> frozenset[str]:
    """The device types whose copies from pinned host memory are stream-ordered (``Backend.async_copies``)."""
    return frozenset(backend.device_type for backend in all_backends() if backend.async_copies)


def copies_non_blocking(source: torch.device, target: torch.device, *, pinned: bool) -> bool:
    """Whether a batch copy may be ``non_blocking``: only from pinned host memory to a device whose backend
    says its copies are stream-ordered (CUDA, XPU).

    From pageable memory the copy is staged and synchronous anyway; CPU-to-MPS non-blocking copies have
    silently corrupted data when the source was freed early (pytorch/pytorch#189690, #139550), which is what
    a training loop does with each batch.
    """
    return pinned and source.type == "cpu" and target.type in _async_copy_targets()


def move(tensor: torch.Tensor, device: torch.device, memory_format: torch.memory_format) -> torch.Tensor:
    """A batch tensor on the device; 4-D tensors (images) in the requested memory format."""
    # is_pinned() asks the accelerator's host allocator: only worth asking when the answer can matter
    pinned = device.type in _async_copy_targets() and tensor.device.type == "cpu" and tensor.is_pinned()
    non_blocking = copies_non_blocking(tensor.device, device, pinned=pinned)
    if tensor.dim() == 4 and memory_format is not torch.contiguous_format:
        return tensor.to(device, memory_format=memory_format, non_blocking=non_blocking)
    return tensor.to(device, non_blocking=non_blocking)


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE", "MEMORY_FORMATS", "copies_non_blocking", "move"]
