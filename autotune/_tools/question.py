"""What identifies a DataLoader question across runs: the dataset by its type, length and first sample's structure
(its arrays by dtype and rank: a random crop's size changes from run to run), and the fixed arguments by what they
are (a function or class by its name, a ``partial`` by its function and arguments), not by their addresses.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset

from autotune._errors import DatasetError
from autotune._tools.apart import Silent, Tick, apart, untouched

#: the first sample is read within this many seconds, or the dataset is not measured
SILENT_S = 30.0


def dataset_signature(dataset: Any, *, method: str) -> tuple[str, str, int]:
    """What describes a dataset, e.g. ``"my_app.data.Photos of 50,000 samples, each (Tensor[float32, 3x64x64],
    int)"``; what identifies it across runs, its tensors by dtype and rank (``"... each (Tensor[float32, 3-d],
    int)"``: a first sample's size may be random, as a random crop's is); and its length. The first sample is read
    apart (``apart.apart``: where workers start by ``method``, nothing it opens is theirs). Raises
    :class:`DatasetError` for one that is empty, has no length, is iterable-style, or raises on its first sample."""
    name = named(dataset)
    if isinstance(dataset, IterableDataset):
        raise DatasetError(name, "it is an IterableDataset: each worker would iterate all of it unless it splits "
                           "itself by torch.utils.data.get_worker_info(), so its loading is not measured")
    try:
        length = len(dataset)
    except TypeError as exc:
        raise DatasetError(name, f"it has no len() ({exc}); a map-style dataset needs __len__ and __getitem__") \
            from exc
    if length == 0:
        raise DatasetError(name, "it is empty (len 0)")
    try:
        with untouched():  # a sample read here draws from the caller's random streams
            sized, unsized = apart(_structures, dataset, method=method, silent_s=SILENT_S)
    except Silent as exc:
        raise DatasetError(name, f"dataset[0] gave nothing: {exc}") from exc
    except Exception as exc:  # the dataset's own code: its exception, whatever it is, is the answer's cause
        raise DatasetError(name, f"dataset[0] raised {type(exc).__name__}: {exc}") from exc
    shown, keyed = (f"{name} of {length:,} samples, each {structure}"[:400] for structure in (sized, unsized))
    return shown, keyed, length


def _structures(dataset: Any, tick: Tick) -> tuple[str, str]:
    """The first sample's structure with its sizes and without them."""
    first = dataset[0]
    return _structure(first, sized=True), _structure(first, sized=False)


def named(dataset: Any) -> str:
    """e.g. ``'my_app.data.Photos'``"""
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}"


def _structure(sample: Any, depth: int = 0, *, sized: bool = True) -> str:
    """One sample's structure, e.g. ``'(Tensor[float32, 3x64x64], int)'``; ``sized=False``: its arrays' ranks
    instead of their sizes, e.g. ``'(Tensor[float32, 3-d], int)'``."""
    shape, dtype = getattr(sample, "shape", None), getattr(sample, "dtype", None)
    if shape is not None and dtype is not None:
        dims = ("x".join(str(d) for d in shape) if sized else f"{len(shape)}-d") if len(shape) else "scalar"
        return f"{type(sample).__name__}[{str(dtype).removeprefix('torch.')}, {dims}]"
    if depth >= 3:
        return type(sample).__name__
    if isinstance(sample, Mapping):
        items = sorted(sample.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{k}: {_structure(v, depth + 1, sized=sized)}" for k, v in items[:8]) + \
            (", ..." if len(items) > 8 else "") + "}"
    if isinstance(sample, (tuple, list)):
        inner = ", ".join(_structure(v, depth + 1, sized=sized) for v in sample[:8]) + \
            (", ..." if len(sample) > 8 else "")
        return f"({inner})" if isinstance(sample, tuple) else f"[{inner}]"
    return type(sample).__name__


def described(fixed: Mapping[str, Any]) -> str:
    """The fixed arguments as they identify a question across runs, by what they are rather than their address, e.g.
    ``"collate_fn=functools.partial(my_app.data.pad, value=0),shuffle=True"``."""
    return ",".join(f"{name}={_what(fixed[name])}" for name in sorted(fixed))


def _what(value: Any, depth: int = 0) -> str:
    """A function, class or method by its name; a ``partial`` by its function and arguments; any other object (a
    callable instance, a sampler) by its class."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, functools.partial) and depth < 3:
        arguments = [_what(v, depth + 1) for v in value.args]
        arguments += [f"{k}={_what(v, depth + 1)}" for k, v in sorted(value.keywords.items())]
        return f"functools.partial({', '.join([_what(value.func, depth + 1), *arguments])})"
    kind = value if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)) \
        else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


__all__ = ["SILENT_S", "dataset_signature", "described", "named"]
