"""A decision in Accelerate's words: the ``accelerate.Accelerator`` keywords (``Config.accelerate_kwargs``)."""

from __future__ import annotations

from typing import Any

import torch

from autotune._decision import Decision
from autotune._errors import FrameworkError
from autotune._variants import CPU, FP16_MIXED, precision_row


def accelerator_kwargs(decision: Decision) -> dict[str, Any]:
    """``Config.accelerate_kwargs``: keyword arguments for ``accelerate.Accelerator`` that train as ``decision`` was
    measured; :class:`FrameworkError` for fp16 on the CPU, which Accelerate would train in fp32."""
    device = torch.device(decision.device)
    if device.type == CPU and decision.precision == FP16_MIXED.name:
        raise FrameworkError("Accelerate", "fp16 mixed precision on the CPU", (
            "Accelerate accepts mixed_precision='fp16' with cpu=True but trains without autocast; keep "
            "mixed_precision='no' and wrap forward + loss in cfg.autocast() yourself"))
    return {"cpu": device.type == CPU, "mixed_precision": precision_row(decision.precision).accelerate}


__all__ = ["accelerator_kwargs"]
