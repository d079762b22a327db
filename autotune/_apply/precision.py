"""What a mixed precision means to torch: the autocast dtype and context, and the GradScaler with its default.

The fp32 / tf32 settings live in :mod:`autotune._apply.fp32`; the variants' layout and batch copy in
:mod:`autotune._apply.axes`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from autotune._variants import PRECISION_ROWS, Precision, precision_row

#: each precision's autocast dtype (None: no autocast), from its row
AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {
    row.name: getattr(torch, row.autocast) if row.autocast is not None else None for row in PRECISION_ROWS
}

#: GradScaler's own default; calibration tries lower ones when fp16 steps overflow at it and are skipped.
DEFAULT_INIT_SCALE = 65536.0


@contextlib.contextmanager
def autocast(device_type: str, precision: Precision) -> Iterator[None]:
    """Autocast to ``precision``'s dtype on ``device_type`` (forward + loss); a no-op for fp32 and tf32."""
    dtype = AUTOCAST_DTYPES[precision]
    with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
        yield


def grad_scaler(device_type: str, precision: Precision, init_scale: float | None) -> torch.amp.GradScaler:
    """A GradScaler enabled only where ``precision``'s row scales, starting at ``init_scale`` (GradScaler's own
    default without one)."""
    return torch.amp.GradScaler(device_type, init_scale=init_scale or DEFAULT_INIT_SCALE,
                                enabled=precision_row(precision).grad_scaler)


__all__ = ["AUTOCAST_DTYPES", "DEFAULT_INIT_SCALE", "autocast", "grad_scaler"]
