"""What a mixed precision means to torch: the autocast dtype and the GradScaler default.

The fp32 / tf32 settings live in :mod:`autotune._apply.fp32`; the variants' layout and batch copy in
:mod:`autotune._apply.axes`.
"""

from __future__ import annotations

import torch

from autotune._variants import PRECISION_ROWS, Precision

#: each precision's autocast dtype (None: no autocast), from its row
AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {
    row.name: getattr(torch, row.autocast) if row.autocast is not None else None for row in PRECISION_ROWS
}

#: GradScaler's own default; calibration tries lower ones when fp16 steps overflow at it and are skipped.
DEFAULT_INIT_SCALE = 65536.0


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE"]
