"""What a mixed precision means to torch: the autocast dtype and the GradScaler default.

The fp32 / tf32 settings live in :mod:`autotune._fp32`; the variants' layout and batch copy in
:mod:`autotune._variants.apply`.
"""

from __future__ import annotations

import torch

from autotune._records import Precision

AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "bf16-mixed": torch.bfloat16,
    "fp16-mixed": torch.float16,
}

#: GradScaler's own default; calibration tries lower ones when fp16 steps overflow at it and are skipped.
DEFAULT_INIT_SCALE = 65536.0


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE"]
