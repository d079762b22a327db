"""The variant axes: the settings of the same math a candidate may change beside its device and precision.

Imports nothing of autotune, nor torch: the records read it. :mod:`autotune._variants.apply` applies them to torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MemoryFormat = Literal["contiguous", "channels_last"]
OptimizerImpl = Literal["default", "foreach", "fused"]


@dataclass(frozen=True)
class Facts:
    """What a built workload says about which variants are worth trying."""

    #: a 4-D (image) input: channels_last may pay off
    image_inputs: bool
    #: the built-in AdamW, which has foreach and fused kernels
    default_optimizer: bool


def fewer_threads(default: int) -> list[int]:
    """CPU thread counts worth trying below torch's ``default``, e.g. ``[1]`` on 2 cores, ``[1, 4]`` on 8."""
    return sorted({1, default // 2} - {0, default})


__all__ = ["Facts", "MemoryFormat", "OptimizerImpl", "fewer_threads"]
