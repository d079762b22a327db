"""The answer: which device and precision to train with, why, and helpers that apply it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

from autotune._models import Precision, Record
from autotune._precision import AUTOCAST_DTYPES, DEFAULT_INIT_SCALE, precision_context

Source = Literal["measured", "forced", "heuristic"]


class Config(Record):
    """A training configuration, e.g. ``Config(model_kind="cnn", device="cpu", precision="bf16-mixed", ...)``.

    ``reason`` says in one or two sentences why this device and this precision; ``source`` says where the
    answer came from: ``measured`` on this machine, ``forced`` by ``AUTOTUNE_DEVICE``, or ``heuristic`` when
    no measurement was possible (the reason says why).
    """

    model_kind: str
    device: str
    precision: Precision
    source: Source
    reason: str
    step_ms: float | None = None
    setup_s: float | None = None
    speedup_vs_fp32_cpu: float | None = None
    init_scale: float | None = None
    num_threads: int | None = None
    noisy: bool = False
    fingerprint_digest: str
    measured_at: str | None = None

    @property
    def device_type(self) -> str:
        """``'cuda'`` for ``'cuda:1'``: what ``torch.autocast`` and ``GradScaler`` take."""
        return self.device.split(":", 1)[0]

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """``torch.bfloat16`` / ``torch.float16`` for mixed precision, None for fp32 and tf32."""
        return AUTOCAST_DTYPES[self.precision]

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Wrap forward + loss: ``with cfg.autocast(): loss = model(x)``; a no-op for fp32."""
        dtype = self.autocast_dtype
        with precision_context(self.precision), torch.autocast(
            self.device_type, dtype=dtype or torch.float32, enabled=dtype is not None
        ):
            yield

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler enabled only for fp16, starting at the init_scale calibration found safe."""
        return torch.amp.GradScaler(
            self.device_type,
            init_scale=self.init_scale or DEFAULT_INIT_SCALE,
            enabled=self.precision == "fp16-mixed",
        )


__all__ = ["Config", "Source"]
