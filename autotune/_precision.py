"""What each precision means to torch: the autocast dtype, the GradScaler default, the tf32 switch."""

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


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE", "precision_context"]
