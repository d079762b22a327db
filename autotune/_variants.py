"""The tables a candidate is made of: its precisions and the variant axes beside its device and precision.

One row per precision (:data:`PRECISION_ROWS`, simplest first): how its float32 math and autocast run, whether a
GradScaler scales the loss, its words in Lightning, Accelerate and a reason. One row per axis (:data:`AXES`): its
:class:`~autotune._records.Choice` field and default, its words, whether torch's own setting wins a tie, whether
every rank of a job shares it, and when the search proposes another setting. The records, the rules, the plan and
the reasons iterate these rows; :mod:`autotune._apply.axes` applies each axis to torch. Imports nothing of
autotune, nor torch: the records read it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args

if TYPE_CHECKING:
    from pydantic import BaseModel

Precision = Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed"]
#: the user's device choice: "gpu" is whatever accelerator this machine has, a backend's name that backend's GPU
Prefer = Literal["auto", "gpu", "cpu", "cuda", "mps", "xpu"]
#: ``best_config``'s and ``--prefer``'s words
PREFERENCES: tuple[Prefer, ...] = get_args(Prefer)
#: the device every machine has, its backend's name: the fp32 reference runs there and a tie goes to it
CPU = "cpu"
#: how far the search looks (``AUTOTUNE_SEARCH``): the precisions only, the default variants, or every axis
Search = Literal["precision", "default", "extended"]
MemoryFormat = Literal["contiguous", "channels_last"]
OptimizerImpl = Literal["default", "foreach", "fused"]

V = TypeVar("V")
C = TypeVar("C", bound="BaseModel")


@dataclass(frozen=True)
class PrecisionRow:
    """One precision, e.g. ``bf16-mixed``: bf16 autocast, no GradScaler, ``'bf16-mixed'`` to Lightning."""

    name: Precision
    #: how float32 matmuls, convolutions and RNNs compute: ``'ieee'``, ``'tf32'`` (on CUDA; IEEE on the CPU), or
    #: None where autocast decides and the app's own settings stand (see :mod:`autotune._apply.fp32`)
    fp32_math: Literal["ieee", "tf32"] | None
    #: autocast's dtype as torch names it, e.g. ``'bfloat16'``; None: no autocast
    autocast: str | None
    #: a GradScaler scales the loss (its init_scale is calibrated and shared by every rank of a job)
    grad_scaler: bool
    #: Lightning's ``precision=`` word; tf32 is fp32 there plus the float32 settings
    lightning: str
    #: Accelerate's ``mixed_precision=`` word
    accelerate: str
    #: in a reason, e.g. ``'bf16 mixed precision'``
    prose: str


FP32 = PrecisionRow(name="fp32", fp32_math="ieee", autocast=None, grad_scaler=False, lightning="32-true",
                    accelerate="no", prose="fp32")
TF32 = PrecisionRow(name="tf32", fp32_math="tf32", autocast=None, grad_scaler=False, lightning="32-true",
                    accelerate="no", prose="TF32")
BF16_MIXED = PrecisionRow(name="bf16-mixed", fp32_math=None, autocast="bfloat16", grad_scaler=False,
                          lightning="bf16-mixed", accelerate="bf16", prose="bf16 mixed precision")
FP16_MIXED = PrecisionRow(name="fp16-mixed", fp32_math=None, autocast="float16", grad_scaler=True,
                          lightning="16-mixed", accelerate="fp16", prose="fp16 mixed precision")
#: every precision, simplest first: among candidates nothing clearly beats, the simpler one is preferred (numerics
#: headroom)
PRECISION_ROWS: tuple[PrecisionRow, ...] = (FP32, TF32, BF16_MIXED, FP16_MIXED)
_PRECISION_BY_NAME = {row.name: row for row in PRECISION_ROWS}


def precision_row(name: Precision) -> PrecisionRow:
    """The row of precision ``name``, e.g. :data:`BF16_MIXED` for ``'bf16-mixed'``."""
    return _PRECISION_BY_NAME[name]


def simplicity(name: Precision) -> int:
    """Lower is simpler: 0 for fp32, then tf32, bf16, fp16 (the order of :data:`PRECISION_ROWS`)."""
    return PRECISION_ROWS.index(_PRECISION_BY_NAME[name])


@dataclass(frozen=True)
class Facts:
    """What a built workload says about which variants are worth trying."""

    #: a 4-D (image) input: channels_last may pay off
    image_inputs: bool
    #: the built-in AdamW, which has foreach and fused kernels
    default_optimizer: bool


@dataclass(frozen=True)
class Situation:
    """What a search stage knows when it proposes variants of a device's leader."""

    facts: Facts
    device: str
    search: Search
    #: torch's CPU thread count in the process that times the candidates
    default_threads: int


@dataclass(frozen=True)
class Axis(Generic[V]):
    """One variant axis, e.g. the optimizer's implementation: ``default``, ``foreach`` or ``fused``."""

    #: the :class:`~autotune._records.Choice` field that holds the setting
    field: str
    #: torch's own setting: what a candidate without this variant runs
    default: V
    #: a non-default setting in a candidate's label, e.g. ``'fused-optimizer'``
    label: Callable[[V], str]
    #: a non-default setting in a reason, e.g. ``'the fused optimizer'``
    prose: Callable[[V], str]
    #: torch's own setting is preferred where nothing is clearly faster; else the faster estimate wins
    preferred: bool
    #: every rank of a job trains with the deciding rank's setting (DDP needs it identical); else each its own
    shared: bool
    #: a non-default setting compiles the model: its first step compiles, so no step limit or first-step
    #: comparison applies to it
    compiles: bool
    #: the search stage that proposes it: 2 (of a device's leader, then combined with the other stage-2 axes in
    #: stage 3) or 3 (of the stage-3 leader, not combined)
    stage: Literal[2, 3]
    #: the settings worth trying on a leader that runs the default
    propose: Callable[[Situation], Sequence[V]]


def fewer_threads(default: int) -> list[int]:
    """CPU thread counts worth trying below torch's ``default``, e.g. ``[1]`` on 2 cores, ``[1, 4]`` on 8."""
    return sorted({1, default // 2} - {0, default})


def threads_per_process(cores: int, processes: int) -> int:
    """Each process's share of ``cores`` when ``processes`` train at once, e.g. 8 of 16 cores for 2: what a CPU
    candidate of a job runs with unless it has a count of its own (and :func:`fewer_threads` proposes below)."""
    return max(1, cores // processes)


def _threads(count: int | None) -> str:
    return f"{count} thread" + ("s" if count != 1 else "")


MEMORY_FORMAT: Axis[MemoryFormat] = Axis(
    field="memory_format", default="contiguous", label=str, prose=str, preferred=False, shared=True, compiles=False,
    stage=2, propose=lambda s: ["channels_last"] if s.facts.image_inputs else [],
)
# foreach is not proposed: on the CPU, where torch's default is the single-tensor loop, fused was faster than
# foreach wherever the optimizer's share of a step showed at all; on CUDA and XPU foreach is torch's default.
OPTIMIZER: Axis[OptimizerImpl] = Axis(
    field="optimizer", default="default", label=lambda impl: f"{impl}-optimizer",
    prose=lambda impl: f"the {impl} optimizer", preferred=False, shared=True, compiles=False, stage=2,
    propose=lambda s: ["fused"] if s.facts.default_optimizer else [],
)
NUM_THREADS: Axis[int | None] = Axis(
    field="num_threads", default=None, label=_threads, prose=_threads, preferred=True, shared=False, compiles=False,
    stage=3,
    propose=lambda s: fewer_threads(s.default_threads) if s.device == CPU else [],
)
COMPILED: Axis[bool] = Axis(
    field="compiled", default=False, label=lambda _: "compiled", prose=lambda _: "torch.compile", preferred=True,
    shared=True, compiles=True, stage=2, propose=lambda s: [True] if s.search == "extended" else [],
)
#: every axis, in the order of a label's words and of the preference's keys
AXES: tuple[Axis[Any], ...] = (MEMORY_FORMAT, OPTIMIZER, NUM_THREADS, COMPILED)


def changed(choice: object) -> list[tuple[Axis[Any], Any]]:
    """The axes on which ``choice`` (a :class:`~autotune._records.Choice`) does not run torch's own setting,
    each with its setting, e.g. ``[(MEMORY_FORMAT, 'channels_last')]``."""
    return [(axis, value) for axis in AXES if (value := getattr(choice, axis.field)) != axis.default]


def compiles(choice: object) -> bool:
    """Whether ``choice`` (a :class:`~autotune._records.Choice`) compiles its model (``torch.compile``)."""
    return any(axis.compiles for axis, _ in changed(choice))


#: the :class:`~autotune._records.Choice` fields every rank of a job shares: the precision and the shared axes
SHARED_FIELDS: tuple[str, ...] = ("precision", *(axis.field for axis in AXES if axis.shared))


def reachable(choice: C, situation: Situation) -> list[C]:
    """``choice`` with every combination of the settings the search may propose in ``situation`` (torch's own
    included), whether or not a search would reach each, e.g. 8 for a CPU candidate of an image model with the
    built-in AdamW, 2 threads and the default search: 2 layouts x 2 optimizer kernels x 2 thread counts."""
    settings = [[axis.default, *axis.propose(situation)] for axis in AXES]
    return [choice.model_copy(update={axis.field: value for axis, value in zip(AXES, combination, strict=True)})
            for combination in itertools.product(*settings)]


def prose(choice: object) -> list[str]:
    """``choice``'s variants in a reason's words, e.g. ``['channels_last', 'the fused optimizer']``."""
    return [axis.prose(value) for axis, value in changed(choice)]


__all__ = [
    "AXES", "BF16_MIXED", "COMPILED", "CPU", "FP16_MIXED", "FP32", "MEMORY_FORMAT", "NUM_THREADS", "OPTIMIZER",
    "PRECISION_ROWS", "PREFERENCES", "SHARED_FIELDS", "TF32", "Axis", "Facts", "MemoryFormat", "OptimizerImpl",
    "Precision", "PrecisionRow", "Prefer", "Search", "Situation", "changed", "compiles", "fewer_threads",
    "precision_row", "prose", "reachable", "simplicity", "threads_per_process",
]
