"""Model families: what a training step looks like for each kind of model an app trains.

A family is a name and a ``build()`` that returns a :class:`Workload`. ``build`` is stored as an importable
reference (``"module:function"``) because it runs in a spawned worker process, which imports it by name.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autotune import _batch
from autotune._errors import BatchSizeUnsupportedError, FamilyRegistrationError, UnknownFamilyError

LossFn = Callable[[nn.Module, Any], Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def adamw(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The default optimizer: AdamW with torch's defaults (lr 1e-3)."""
    return torch.optim.AdamW(params)


@dataclass(frozen=True)
class Workload:
    """One batch of one model's training: ``loss(model, inputs)`` is forward + loss, on CPU tensors.

    ``inputs`` is the batch as the app's loader hands it: a tensor, or tensors in a tuple, list, dict or other
    mapping (a Hugging Face ``BatchEncoding``) or dataclass, nested, e.g. ``{"input_ids": ids, "attention_mask":
    mask, "labels": labels}``; ints, strings and None beside them are handed to ``loss`` as they are. Each step moves
    its tensors to the device as ``Config.prepare_batch`` does, into containers of the same types.
    """

    model: nn.Module
    inputs: Any
    loss: LossFn
    optimizer: OptimizerFactory = field(default=adamw)


BuildFn = Callable[..., Workload]


def _resolve(ref: str) -> object:
    """The object a ``"package.module:qualified.name"`` reference names, imported as the worker does."""
    module_name, _, qualname = ref.partition(":")
    target: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Family:
    """A registered model kind, e.g. ``Family(name="cnn", ref="autotune._families:build_cnn")``."""

    name: str
    ref: str
    description: str = ""
    #: the app's own version of the model behind ``ref``; a new one measures the family again
    version: str | None = None

    def build(self, batch_size: int | None = None) -> Workload:
        """Import the build function by reference and call it, with ``batch_size=`` when one is given."""
        target = _resolve(self.ref)
        if not callable(target):
            raise FamilyRegistrationError(self.name, f"{self.ref} is not callable")
        if batch_size is not None and not self.accepts_batch_size():
            raise BatchSizeUnsupportedError(self.name, self.ref)
        workload = target() if batch_size is None else target(batch_size=batch_size)
        if not isinstance(workload, Workload):
            raise FamilyRegistrationError(
                self.name, f"{self.ref}() returned {type(workload).__name__}, expected autotune.Workload"
            )
        if (problem := _batch.problem(workload.inputs)) is not None:
            raise FamilyRegistrationError(self.name, (
                f"{self.ref}() returned a Workload whose {problem}: calibration moves a batch's tensors to each "
                "device, so hand tensors (torch.as_tensor) and plain values (int, float, str, None), in tuples, "
                "lists, dicts or dataclasses, as a DataLoader hands them"))
        return workload

    def default_batch_size(self) -> int | None:
        """The batch ``build()`` makes when given none, as its ``batch_size`` keyword's default says, e.g. 64 (the
        batch calibration times); None where the build takes no such keyword or gives it no int default."""
        try:
            parameter = inspect.signature(_resolve(self.ref)).parameters.get("batch_size")  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        default = parameter.default if parameter is not None else None
        return default if isinstance(default, int) and not isinstance(default, bool) and default > 0 else None

    def accepts_batch_size(self) -> bool:
        """Whether ``build`` takes a ``batch_size`` keyword (``autotune.max_batch_size`` needs one)."""
        target = _resolve(self.ref)
        try:
            parameters = inspect.signature(target).parameters.values()  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return any((p.name == "batch_size" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
                   or p.kind is p.VAR_KEYWORD for p in parameters)


# -- built-in families -------------------------------------------------------------------------------------


def cross_entropy(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    features, labels = inputs
    return F.cross_entropy(model(features), labels)


def build_tiny_mlp(batch_size: int = 64) -> Workload:
    """A hand-gesture classifier: 21 hand landmarks x 3 coordinates in, 10 gestures out, batch 64."""
    model = nn.Sequential(nn.Linear(63, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return Workload(model, (torch.randn(batch_size, 63), torch.randint(0, 10, (batch_size,))), cross_entropy)


def build_mlp(batch_size: int = 256) -> Workload:
    """A wider MLP on flattened features (e.g. embeddings or 28x28 images)."""
    model = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )
    return Workload(model, (torch.randn(batch_size, 784), torch.randint(0, 10, (batch_size,))), cross_entropy)


def _conv_block(channels_in: int, channels_out: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


def build_cnn(batch_size: int = 32) -> Workload:
    """A small image classifier: three conv + batchnorm blocks on 64x64 RGB images, batch 32."""
    model = nn.Sequential(
        _conv_block(3, 32), _conv_block(32, 64), _conv_block(64, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )
    return Workload(model, (torch.randn(batch_size, 3, 64, 64), torch.randint(0, 10, (batch_size,))), cross_entropy)


class TextClassifier(nn.Module):
    """Token embedding, a small transformer encoder, mean pooling, a linear head."""

    def __init__(self, vocab: int = 1000, width: int = 256, layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.head(self.encoder(self.embed(tokens)).mean(dim=1))
        return out


def build_transformer(batch_size: int = 16) -> Workload:
    """A small text classifier: 2 encoder layers, width 256, 16 sequences of 128 tokens."""
    inputs = (torch.randint(0, 1000, (batch_size, 128)), torch.randint(0, 10, (batch_size,)))
    return Workload(TextClassifier(), inputs, cross_entropy)


BUILTIN_FAMILIES: tuple[Family, ...] = (
    Family("tiny_mlp", f"{__name__}:build_tiny_mlp", "63 features -> 128 -> 64 -> 10, batch 64"),
    Family("mlp", f"{__name__}:build_mlp", "784 -> 1024 -> 1024 -> 10, batch 256"),
    Family("cnn", f"{__name__}:build_cnn", "3 conv+BN blocks, 32 x 3 x 64 x 64"),
    Family("transformer", f"{__name__}:build_transformer", "2-layer encoder, width 256, 16 x 128 tokens"),
)

_registry: dict[str, Family] = {f.name: f for f in BUILTIN_FAMILIES}


def _reference_for(name: str, build: object) -> str:
    """An import path a spawned worker can resolve, or a FamilyRegistrationError saying what to do."""
    if isinstance(build, str):
        module_name, sep, qualname = build.partition(":")
        if not sep or not module_name or not qualname:
            raise FamilyRegistrationError(name, f"{build!r} is not of the form 'package.module:function'")
        try:
            target = _resolve(build)
        except (ImportError, AttributeError) as exc:
            raise FamilyRegistrationError(name, f"cannot import {build!r}: {exc}") from exc
        if not callable(target):
            raise FamilyRegistrationError(name, f"{build!r} is not callable")
        return build
    if not callable(build):
        raise FamilyRegistrationError(name, f"build must be a function or 'module:function', got {build!r}")
    defined_in: str | None = getattr(build, "__module__", None)
    qualname = getattr(build, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname or not defined_in:
        raise FamilyRegistrationError(
            name,
            f"{qualname or build!r} is a lambda or a nested function; calibration runs in a spawned worker "
            "that imports build() by name, so define it at the top level of a module (or pass "
            "'module:function')",
        )
    module_name = defined_in
    if module_name == "__main__":
        # Like multiprocessing's spawn: the worker imports the main script as a module from its directory.
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        main_file = getattr(main, "__file__", None)
        if spec is not None:
            module_name = spec.name
        elif main_file:
            module_name = main_file.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        else:
            raise FamilyRegistrationError(
                name, "functions defined in an interactive session cannot be imported by the worker; "
                "move build() into a module and register 'module:function'",
            )
    return f"{module_name}:{qualname}"


def register_family(
    name: str, build: BuildFn | str, *, description: str = "", version: str | None = None
) -> Family:
    """Register a model kind: ``register_family("detector", "my_app.models:build_detector", version="2")``.

    ``build()`` returns one batch's :class:`Workload` at the batch size the app trains with. Give it a
    ``batch_size`` keyword with that default (``def build_detector(batch_size: int = 8)``) and
    :func:`autotune.max_batch_size` can measure how large a batch fits, and calibration can probe a slow
    precision on an eighth of the batch before its first full step; everything it times runs ``build()``.

    Stored measurements are keyed by ``build``'s reference and ``version``: registering another build, or
    the same build with another ``version`` (the app changed the model), measures the family again.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise FamilyRegistrationError(
            str(name), "names are 1-64 letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    if version is not None and (not isinstance(version, str) or not version or len(version) > 64):
        raise FamilyRegistrationError(
            name, f"version must be a non-empty string of at most 64 characters, got {version!r}"
        )
    family = Family(name, _reference_for(name, build), description, version)
    _registry[name] = family
    return family


def reset_registry() -> None:
    """Forget every family registered in this process: the built-ins are left."""
    _registry.clear()
    _registry.update({f.name: f for f in BUILTIN_FAMILIES})


def get_family(name: str) -> Family:
    """The family registered as ``name``; raises UnknownFamilyError with the closest known name, TypeError for a
    name that is no string."""
    if not isinstance(name, str):
        raise TypeError(f"a model kind is a name such as 'cnn', got {type(name).__name__} {name!r}; known: "
                        f"{', '.join(sorted(_registry))}")
    try:
        return _registry[name]
    except KeyError:
        raise UnknownFamilyError(name, _registry) from None


def family_names() -> list[str]:
    return list(_registry)


def builtin_family_names() -> list[str]:
    return [f.name for f in BUILTIN_FAMILIES]


__all__ = [
    "BUILTIN_FAMILIES",
    "Family",
    "Workload",
    "builtin_family_names",
    "family_names",
    "get_family",
    "register_family",
    "reset_registry",
]
