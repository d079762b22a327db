"""One candidate's training step on its device: the unit every measurement and every check runs.

A step is what the user's loop does per batch: move the batch to the device, forward + loss under autocast,
backward (scaled for fp16), optimizer step, then synchronise so the time is the time the user waits for.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from autotune._families import Family
from autotune._models import Candidate
from autotune._precision import AUTOCAST_DTYPES, DEFAULT_INIT_SCALE, precision_context
from autotune.backends import Backend

class TrainStep:
    """Model, optimizer and GradScaler of one candidate, built from ``family`` with a fixed seed."""

    def __init__(
        self, family: Family, candidate: Candidate, backend: Backend, *, seed: int, init_scale: float | None = None
    ) -> None:
        self.candidate = candidate
        self.backend = backend
        self.device = torch.device(candidate.device)
        started = time.perf_counter()
        torch.manual_seed(seed)
        workload = family.build()
        self.initial_params = [p.detach().clone() for p in workload.model.parameters()]
        # Device initialisation happens here, outside the first step, and counts as set-up.
        torch.empty(1, device=self.device)
        backend.synchronize(candidate.device)
        self.model = workload.model.to(self.device)
        self.model.train()
        self.inputs = workload.inputs
        self.loss_fn = workload.loss
        self.optimizer = workload.optimizer(self.model.parameters())
        self.dtype = AUTOCAST_DTYPES[candidate.precision]
        self.init_scale = (init_scale or DEFAULT_INIT_SCALE) if self.dtype is torch.float16 else None
        self.scaler = torch.amp.GradScaler(
            backend.device_type, init_scale=self.init_scale or DEFAULT_INIT_SCALE, enabled=self.init_scale is not None
        )
        self.build_s = time.perf_counter() - started

    def _forward_backward(self) -> Tensor:
        inputs = tuple(t.to(self.device, non_blocking=True) for t in self.inputs)
        with torch.autocast(self.backend.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            loss = self.loss_fn(self.model, inputs)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        return loss

    def run(self) -> None:
        """One training step, synchronised."""
        with precision_context(self.candidate.precision):
            self._forward_backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.backend.synchronize(self.candidate.device)

    def run_checked(self) -> tuple[float, float, bool]:
        """One training step that also reports (loss, gradient norm, whether GradScaler skipped it)."""
        with precision_context(self.candidate.precision):
            loss = self._forward_backward()
            self.scaler.unscale_(self.optimizer)
            grads = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
            grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
            scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.backend.synchronize(self.candidate.device)
        # GradScaler has no "skipped" flag (pytorch/pytorch#67590): it halves the scale at every skip.
        skipped = scale_before is not None and self.scaler.get_scale() < scale_before
        return float(loss.detach().float()), grad_norm, skipped

    def update(self) -> Tensor:
        """All parameters' change since the seed, flattened on the CPU."""
        return torch.cat(
            [(p.detach().float().cpu() - p0.float()).flatten() for p, p0 in zip(self.model.parameters(), self.initial_params, strict=True)]
        )


__all__ = ["TrainStep"]
