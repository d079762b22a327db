"""A batch as a loader hands it: tensors in dicts and other mappings (a Hugging Face ``BatchEncoding``), tuples
(named ones too), lists and dataclasses, nested, with plain values (ints, strings, None) beside them.

The one walk of a batch, for calibration's steps, ``Config.prepare_batch`` and the guard's replay alike: a walked
batch keeps its containers' types and its plain values, and only its tensors change. ``torch.utils._pytree`` is no
help here: dataclasses and ``collections.UserDict`` (``BatchEncoding``'s base) are leaves to it. Imports nothing of
autotune.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

import torch

B = TypeVar("B")

#: the values a batch may hold beside its tensors, handed through untouched (a sample's id, its text, a flag)
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _fields(value: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(value) if f.init]


def _is_dataclass(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _branches(value: Any) -> list[tuple[str, Any]] | None:
    """Each part of a container with its step of the path, e.g. ``("['input_ids']", tensor)``; None for a leaf."""
    if isinstance(value, Mapping):
        return [(f"[{key!r}]", part) for key, part in value.items()]
    if isinstance(value, (tuple, list)):
        return [(f"[{index}]", part) for index, part in enumerate(value)]
    if _is_dataclass(value):
        return [(f".{name}", getattr(value, name)) for name in _fields(value)]
    return None


def _leaves(batch: object, path: str = "") -> Iterator[tuple[str, object]]:
    """Every leaf of ``batch`` with its path, in order, e.g. ``("['labels']", tensor)``."""
    branches = _branches(batch)
    if branches is None:
        yield path, batch
        return
    for step, part in branches:
        yield from _leaves(part, path + step)


def tensors(batch: object) -> list[torch.Tensor]:
    """The tensors of ``batch``, in order."""
    return [leaf for _, leaf in _leaves(batch) if isinstance(leaf, torch.Tensor)]


def map_tensors(batch: B, change: Callable[[torch.Tensor], torch.Tensor]) -> B:
    """``batch`` with each of its tensors replaced by ``change(tensor)``; its containers are new ones of the same
    types (``batch`` itself is left as it was), its plain values the same objects."""
    result: Any
    if isinstance(batch, torch.Tensor):
        result = change(batch)
    elif isinstance(batch, Mapping):
        parts = {key: map_tensors(part, change) for key, part in batch.items()}
        if type(batch) is dict or not isinstance(batch, MutableMapping):
            result = parts
        else:  # a BatchEncoding keeps its encodings, a defaultdict its factory
            result = copy.copy(batch)
            result.update(parts)
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple takes its fields one by one
        result = type(batch)(*(map_tensors(part, change) for part in batch))
    elif isinstance(batch, (tuple, list)):
        result = type(batch)(map_tensors(part, change) for part in batch)
    elif _is_dataclass(batch):
        result = dataclasses.replace(  # type: ignore[type-var]
            batch, **{name: map_tensors(getattr(batch, name), change) for name in _fields(batch)})
    else:
        result = batch
    return result  # type: ignore[no-any-return]


def problem(batch: object) -> str | None:
    """Why ``batch`` cannot be moved to a device as a loader's batch is, e.g. ``"inputs['image'] is a
    numpy.ndarray, not a tensor"``; None when it can: it holds nothing but tensors and plain values, in mappings,
    tuples, lists and dataclasses."""
    for path, leaf in _leaves(batch):
        if not isinstance(leaf, (torch.Tensor, *_PLAIN)):
            kind = type(leaf)
            return f"inputs{path} is a {kind.__module__}.{kind.__qualname__}, not a tensor"
    return None


def size(batch: object) -> int | None:
    """The batch's size: the first dimension its tensors share, e.g. 16; None where a tensor has no dimension or
    two disagree (no batch to slice along)."""
    sizes = {t.shape[0] if t.dim() else None for t in tensors(batch)}
    return sizes.pop() if len(sizes) == 1 else None


__all__ = ["map_tensors", "problem", "size", "tensors"]
