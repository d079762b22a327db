"""The numerics gate: a fast candidate must also train like fp32 does (fp16 overflows, a kernel is fast but wrong).

Every candidate runs the same first optimizer steps from the same seed and batch as the fp32 CPU reference; its
losses, gradient norms and the cosine of its parameter update must agree within ``TOLERANCES`` for its
precision, set by the rounding that precision adds. fp16 whose steps GradScaler skips is retried at each of
``INIT_SCALES``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from autotune import _variants
from autotune._records import Numerics, Precision


@dataclass(frozen=True)
class Tolerance:
    loss: float
    grad: float
    cosine: float


#: each precision's, by the rounding it adds (a rule: the rules digest reads it)
TOLERANCES: dict[Precision, Tolerance] = {
    _variants.FP32.name: Tolerance(loss=1e-3, grad=1e-2, cosine=0.95),
    _variants.TF32.name: Tolerance(loss=1e-2, grad=5e-2, cosine=0.95),
    _variants.FP16_MIXED.name: Tolerance(loss=2e-2, grad=0.15, cosine=0.8),
    _variants.BF16_MIXED.name: Tolerance(loss=5e-2, grad=0.3, cosine=0.7),
}

#: GradScaler init_scale values tried in turn while steps are skipped: its default first, then lower ones
INIT_SCALES = (65536.0, 1024.0, 32.0)


@dataclass
class Trajectory:
    """What one candidate's checked steps produced."""

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    update: Tensor | None = None
    #: the reference's update after fewer steps, for candidates verified over a shorter window (variants)
    early_updates: dict[int, Tensor] = field(default_factory=dict)

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)


def _max_relative(values: list[float], reference: list[float], floor: float) -> float:
    return max((abs(v - r) / max(abs(r), floor) for v, r in zip(values, reference, strict=False)), default=0.0)


def compare(
    trajectory: Trajectory, reference: Trajectory, precision: Precision, *, init_scale: float | None,
    default_scale_skipped: int | None = None,
) -> tuple[Numerics, str | None]:
    """The candidate's numbers against the reference, and a human reason when they disagree."""
    tolerance = TOLERANCES[precision]
    # Relative to the first loss: a loss that falls towards zero would otherwise make any difference "huge".
    loss_floor = max(abs(reference.losses[0]), 1e-6) if reference.losses else 1.0
    loss_error = _max_relative(trajectory.losses, reference.losses, loss_floor)
    grad_floor = 1e-3 * max(reference.grad_norms, default=1.0)
    grad_error = _max_relative(trajectory.grad_norms, reference.grad_norms, grad_floor)
    cosine = 1.0
    reference_update = reference.early_updates.get(len(trajectory.losses), reference.update)
    if trajectory.update is not None and reference_update is not None:
        cosine = float(torch.nn.functional.cosine_similarity(trajectory.update, reference_update, dim=0))
    numerics = Numerics(
        losses=trajectory.losses,
        grad_norms=trajectory.grad_norms,
        loss_error=loss_error if math.isfinite(loss_error) else 1e30,
        grad_error=grad_error if math.isfinite(grad_error) else 1e30,
        update_cosine=cosine if math.isfinite(cosine) else -1.0,
        tolerance=tolerance.loss,
        init_scale=init_scale,
        skipped_steps=trajectory.skipped_steps,
        default_scale_skipped=default_scale_skipped,
    )
    steps = len(trajectory.losses)
    if not all(math.isfinite(v) for v in trajectory.losses):
        return numerics, f"{precision}: non-finite loss within {steps} steps ({_fmt(trajectory.losses)})"
    if trajectory.skipped_steps:
        return numerics, (
            f"{precision}: GradScaler skipped {trajectory.skipped_steps} of {steps} steps "
            f"even at init_scale {init_scale:g}"
        )
    if not all(math.isfinite(v) for v in trajectory.grad_norms):
        return numerics, f"{precision}: non-finite gradients within {steps} steps"
    if loss_error > tolerance.loss:
        return numerics, (
            f"{precision}: loss after {steps} steps {trajectory.losses[-1]:.4g} vs fp32 "
            f"{reference.losses[-1]:.4g} (error {loss_error:.2g} > {tolerance.loss:g})"
        )
    if grad_error > tolerance.grad:
        return numerics, f"{precision}: gradient norms differ from fp32 by {grad_error:.2g} (> {tolerance.grad:g})"
    if cosine < tolerance.cosine:
        return numerics, (
            f"{precision}: parameter update after {steps} steps points elsewhere than fp32's "
            f"(cosine {cosine:.2f} < {tolerance.cosine:g})"
        )
    return numerics, None


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values[:4]) + (", ..." if len(values) > 4 else "")


__all__ = ["INIT_SCALES", "TOLERANCES", "Tolerance", "Trajectory", "compare"]
