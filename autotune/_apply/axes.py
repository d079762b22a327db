"""The variant axes applied to torch, one row per axis (:data:`APPLY`): where its setting reaches the model, a
batch, the optimizer, the forward pass or the process. The timed step and ``Config.prepare`` apply the same rows;
the batch copy the layout rides on is here too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_args

import torch
from torch import nn

from autotune import _batch
from autotune._families import Workload, adamw
from autotune._records import Choice
from autotune._variants import (
    AXES,
    COMPILED,
    CPU,
    MEMORY_FORMAT,
    NUM_THREADS,
    OPTIMIZER,
    Facts,
    MemoryFormat,
    OptimizerImpl,
)
from autotune.backends import all_backends

log = logging.getLogger("autotune")

V = TypeVar("V")
B = TypeVar("B")

#: each memory format's torch layout, in the order of the table's names
MEMORY_FORMATS: dict[MemoryFormat, torch.memory_format] = dict(
    zip(get_args(MemoryFormat), (torch.contiguous_format, torch.channels_last), strict=True))


def _no_keywords(value: object) -> dict[str, Any]:
    return {}


def _no_tensor_keywords(value: object, tensor: torch.Tensor) -> dict[str, Any]:
    return {}


def _same_model(value: object, model: nn.Module) -> nn.Module:
    return model


def _nothing_to_restore() -> None:
    return None


def _process_untouched(value: object, device: str) -> Callable[[], None]:
    return _nothing_to_restore


@dataclass(frozen=True)
class Apply(Generic[V]):
    """Where one axis's setting reaches torch; a hook left out changes nothing there."""

    #: keywords for ``model.to(device, ...)``, before the optimizer takes the parameters
    model: Callable[[V], dict[str, Any]] = _no_keywords
    #: keywords for a batch tensor's ``.to(device, ...)``
    batch: Callable[[V, torch.Tensor], dict[str, Any]] = _no_tensor_keywords
    #: keywords for the optimizer
    optimizer: Callable[[V], dict[str, Any]] = _no_keywords
    #: every optimizer keyword the axis may set: the caller's own choice of any of them wins over the measured one
    optimizer_keywords: tuple[str, ...] = ()
    #: what runs forward, from the placed model (sharing its parameters)
    forward: Callable[[V, nn.Module], nn.Module] = _same_model
    #: sets a process-wide setting for a candidate on ``device``; returns what restores the one before
    process: Callable[[V, str], Callable[[], None]] = _process_untouched


def _layout(memory_format: MemoryFormat) -> dict[str, Any]:
    return {"memory_format": MEMORY_FORMATS[memory_format]}


def _image_layout(memory_format: MemoryFormat, tensor: torch.Tensor) -> dict[str, Any]:
    """4-D tensors (images) in the memory format; the others as they come."""
    return _layout(memory_format) if tensor.dim() == 4 and memory_format != MEMORY_FORMAT.default else {}


def _implementation(implementation: OptimizerImpl) -> dict[str, Any]:
    return {} if implementation == OPTIMIZER.default else {implementation: True}


def _threads(count: int | None, device: str) -> Callable[[], None]:
    """CPU intra-op threads, for a block of one candidate's steps or for the user's process.

    Set around a candidate's share of a round, outside its timed steps: switching the count is not part of a
    training step, so no candidate's time includes it.
    """
    if count is None or device != CPU:
        return _nothing_to_restore
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    return functools.partial(torch.set_num_threads, before)


def _compile(compiled: bool, model: nn.Module) -> nn.Module:
    return torch.compile(model) if compiled else model  # type: ignore[return-value]


#: how each axis of :data:`autotune._variants.AXES` reaches torch, by its field
APPLY: dict[str, Apply[Any]] = {
    MEMORY_FORMAT.field: Apply(model=_layout, batch=_image_layout),
    OPTIMIZER.field: Apply(optimizer=_implementation, optimizer_keywords=tuple(
        keyword for implementation in get_args(OptimizerImpl) for keyword in _implementation(implementation))),
    NUM_THREADS.field: Apply(process=_threads),
    COMPILED.field: Apply(forward=_compile),
}


def _rows(choice: Choice) -> Iterator[tuple[Apply[Any], Any]]:
    return ((APPLY[axis.field], getattr(choice, axis.field)) for axis in AXES)


def model_keywords(choice: Choice) -> dict[str, Any]:
    """Keywords for ``model.to(device, ...)``, e.g. ``{"memory_format": torch.channels_last}``."""
    return {keyword: value for row, setting in _rows(choice) for keyword, value in row.model(setting).items()}


def batch_keywords(choice: Choice, tensor: torch.Tensor) -> dict[str, Any]:
    """Keywords for ``tensor.to(device, ...)`` of a batch tensor, e.g. ``{"memory_format": torch.channels_last}``
    for an image batch."""
    return {keyword: value for row, setting in _rows(choice) for keyword, value in row.batch(setting, tensor).items()}


def optimizer_requests(choice: Choice) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """Each axis's optimizer keywords, with every keyword that axis may set, e.g. ``[({"fused": True},
    ("foreach", "fused"))]``; empty where ``choice`` runs torch's own optimizer."""
    return [(wanted, row.optimizer_keywords) for row, setting in _rows(choice) if (wanted := row.optimizer(setting))]


def accepts_keyword(optimizer: Callable[..., Any], keyword: str) -> bool:
    """Whether ``optimizer(params, **{keyword: True})`` names the keyword in its signature
    (``**kwargs`` does not count)."""
    try:
        parameters = inspect.signature(optimizer).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: do not guess
        return False
    parameter = parameters.get(keyword)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def optimizer_kwargs_for(
    optimizer: Callable[..., Any], choice: Choice, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The optimizer keywords ``choice`` was measured with, e.g. ``{"fused": True}``, that ``optimizer`` takes
    and ``options`` leave to it.

    The caller's own choice in ``options`` of any keyword an axis may set (``fused=`` / ``foreach=``) wins (INFO
    log); an optimizer without the keyword gets nothing of that axis (WARNING log: the measured gain is not
    realised).
    """
    name = getattr(optimizer, "__qualname__", repr(optimizer))
    kwargs: dict[str, Any] = {}
    for wanted, keywords in optimizer_requests(choice):
        measured = ", ".join(wanted)
        chosen = [k for k in options if k in keywords]
        if chosen:
            log.info("%s: the caller's %s wins over the measured %s implementation", name,
                     ", ".join(f"{k}={options[k]!r}" for k in chosen), measured)
        elif missing := [k for k in wanted if not accepts_keyword(optimizer, k)]:
            log.warning("%s takes no %s= keyword: the %s implementation calibration measured (with AdamW) is not "
                        "applied", name, "=, ".join(missing), measured)
        else:
            kwargs.update(wanted)
    return kwargs


def forward(choice: Choice, model: nn.Module) -> nn.Module:
    """What runs forward: ``model`` itself, or ``torch.compile(model)``."""
    for row, setting in _rows(choice):
        model = row.forward(setting, model)
    return model


def set_process(choice: Choice) -> list[Callable[[], None]]:
    """Set ``choice``'s process-wide settings (its CPU thread count); returns what restores each one, in order."""
    return [row.process(setting, choice.device) for row, setting in _rows(choice)]


@contextlib.contextmanager
def process(choice: Choice) -> Iterator[None]:
    """``choice``'s process-wide settings for a block, restored after it."""
    restores = set_process(choice)
    try:
        yield
    finally:
        for restore in reversed(restores):
            restore()


def facts(workload: Workload) -> Facts:
    """What ``workload`` says about which variants are worth trying."""
    return Facts(image_inputs=any(t.dim() == 4 for t in _batch.tensors(workload.inputs)),
                 default_optimizer=workload.optimizer is adamw)


def make_optimizer(workload: Workload, model: nn.Module, choice: Choice) -> torch.optim.Optimizer:
    """The workload's optimizer; the built-in AdamW with ``choice``'s optimizer keywords (e.g. ``fused=True``)."""
    keywords = {keyword: value for wanted, _ in optimizer_requests(choice) for keyword, value in wanted.items()}
    if not keywords:
        return workload.optimizer(model.parameters())
    if workload.optimizer is not adamw:
        raise ValueError(f"the optimizer keywords {keywords} need the built-in AdamW, not {workload.optimizer!r}")
    return torch.optim.AdamW(model.parameters(), **keywords)


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
    return pinned and source.type == CPU and target.type in _async_copy_targets()


def move(tensor: torch.Tensor, device: torch.device, keywords: Mapping[str, Any]) -> torch.Tensor:
    """A batch tensor on the device, copied with ``keywords`` (:func:`batch_keywords`)."""
    # is_pinned() asks the accelerator's host allocator: only worth asking when the answer can matter
    pinned = device.type in _async_copy_targets() and tensor.device.type == CPU and tensor.is_pinned()
    return tensor.to(device, non_blocking=copies_non_blocking(tensor.device, device, pinned=pinned), **keywords)


def move_batch(choice: Choice, batch: B) -> B:
    """``batch`` (a loader's, any shape :mod:`autotune._batch` walks) on ``choice``'s device: each tensor moved with
    its :func:`batch_keywords`, the rest as it comes. The timed step and ``Config.prepare_batch`` both move so."""
    device = torch.device(choice.device)
    return _batch.map_tensors(batch, lambda tensor: move(tensor, device, batch_keywords(choice, tensor)))


__all__ = [
    "APPLY", "MEMORY_FORMATS", "Apply", "accepts_keyword", "batch_keywords", "copies_non_blocking", "facts", "forward",
    "make_optimizer", "model_keywords", "move", "move_batch", "optimizer_kwargs_for", "optimizer_requests", "process",
    "set_process",
]
