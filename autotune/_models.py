"""The measurement records: what a calibration found, stored raw so decisions can be re-derived later."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")

FailureKind = Literal["crashed", "timeout", "oom", "error", "unsupported", "numerics", "too_slow"]


class Record(BaseModel):
    """Frozen, explicit fields; unknown keys from a newer minor writer are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Candidate(Record):
    """One configuration to try, e.g. ``Candidate(device="cpu", precision="bf16-mixed")``."""

    device: str
    precision: Precision

    @property
    def label(self) -> str:
        """e.g. ``'cpu bf16-mixed'``"""
        return f"{self.device} {self.precision}"


class Failure(Record):
    """Why a candidate cannot be used, e.g. ``Failure(kind="crashed", detail="SIGABRT in step")``."""

    kind: FailureKind
    detail: str


class Interval(Record):
    """A ratio of step times with its 95% interval, e.g. ``Interval(estimate=0.55, low=0.52, high=0.58)``."""

    estimate: float
    low: float
    high: float

    def describe(self) -> str:
        return f"{self.estimate:.2f}x, interval {self.low:.2f}-{self.high:.2f}"


class Timing(Record):
    """Interleaved timing of one candidate: one sample per round (the median of that round's steps)."""

    round_ms: list[float]
    steps_per_round: int
    median_ms: float
    spread: float = Field(description="interquartile range / median of the round samples")
    vs_baseline: Interval | None = Field(
        default=None, description="step-time ratio to fp32 on the CPU, paired by round"
    )

    @property
    def n(self) -> int:
        return len(self.round_ms)


class Numerics(Record):
    """The candidate's first optimizer steps compared with the fp32 CPU reference from the same seed."""

    losses: list[float]
    grad_norms: list[float]
    loss_error: float = Field(description="max relative loss difference to the reference")
    grad_error: float = Field(description="max relative gradient-norm difference to the reference")
    update_cosine: float = Field(description="cosine between the parameter updates after the window")
    tolerance: float
    init_scale: float | None = None
    skipped_steps: int = 0
    default_scale_skipped: int | None = Field(
        default=None, description="steps skipped at GradScaler's default init_scale, when a lower one was needed"
    )


class CandidateResult(Record):
    """Everything measured for one candidate; ``failure`` set means it must never be picked."""

    candidate: Candidate
    failure: Failure | None = None
    setup_s: float | None = Field(default=None, description="device init + model to device + first step")
    first_step_ms: float | None = None
    timing: Timing | None = None
    numerics: Numerics | None = None
    num_threads: int | None = None
    device_name: str | None = None
    peak_bytes: int | None = None

    @property
    def usable(self) -> bool:
        return self.failure is None and self.timing is not None


class FamilyResult(Record):
    """One calibration of one model kind on one machine."""

    model_kind: str
    measured_at: str
    autotune_version: str
    wall_s: float
    worker_start_s: float = Field(default=0.0, description="the first worker's start, included in wall_s")
    budget_s: float
    candidates: list[CandidateResult]
    control_ms: list[float] = Field(default_factory=list, description="control workload, one per round")
    noisy: bool = False
    backend_notes: dict[str, str] = Field(
        default_factory=dict, description="why a backend offered no candidate, e.g. {'cuda': 'not built'}"
    )

    def result(self, candidate: Candidate) -> CandidateResult | None:
        return next((r for r in self.candidates if r.candidate == candidate), None)


__all__ = [
    "PRECISIONS",
    "Candidate",
    "CandidateResult",
    "Failure",
    "FailureKind",
    "FamilyResult",
    "Interval",
    "Numerics",
    "Precision",
    "Timing",
]
