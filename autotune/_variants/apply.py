"""The variant axes applied to torch: the model's memory format, the batch copy, the optimizer, the threads."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from autotune._families import Workload, adamw
from autotune._variants import OptimizerImpl
from autotune.backends import all_backends

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


def make_optimizer(workload: Workload, model: torch.nn.Module, impl: OptimizerImpl) -> torch.optim.Optimizer:
    """The workload's optimizer; the built-in AdamW in its foreach or fused implementation when asked."""
    if impl == "default":
        return workload.optimizer(model.parameters())
    if workload.optimizer is not adamw:
        raise ValueError(f"the {impl} optimizer variant needs the built-in AdamW, not {workload.optimizer!r}")
    return torch.optim.AdamW(model.parameters(), foreach=impl == "foreach", fused=impl == "fused")


@contextlib.contextmanager
def threads_context(num_threads: int | None) -> Iterator[None]:
    """CPU intra-op threads for one candidate's steps; candidates with other counts interleave with it.

    Entered around a candidate's share of a round, outside its timed steps: switching the count is not
    part of a training step, so no candidate's time includes it.
    """
    if num_threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["MEMORY_FORMATS", "copies_non_blocking", "make_optimizer", "move", "threads_context"]
