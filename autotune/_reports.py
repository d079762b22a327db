"""What the profiling tools report: ``autotune.trace`` (a traced step's operators) and
``autotune.max_batch_report`` (the largest batch that fits, with the probes and the fitted memory line)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune._models import Candidate, Record


class OperatorTime(Record):
    """One operator's share of a traced step, e.g. ``OperatorTime(name="aten::convolution_backward", ...)``.

    Times are per training step (totals over the traced steps divided by their count), in milliseconds.
    """

    name: str
    calls_per_step: float
    self_cpu_ms: float
    self_device_ms: float | None


class TraceReport(Record):
    """What ``autotune.trace`` found: the Chrome trace file and the operators that took the most self time.

    ``operators`` are sorted by self device time when the device's kernels were recorded (``device_activity``
    is ``"CUDA"`` or ``"XPU"``: their time is the step's), else by self CPU time; ``self_total_ms`` is the sum
    of that time over every operator, per step.
    """

    model_kind: str
    candidate: Candidate
    path: str
    warmup_steps: int
    steps: int
    step_ms: float = Field(description="mean wall time of a traced step, the profiler's overhead included")
    device_activity: str | None
    self_total_ms: float
    operators: list[OperatorTime]


ProbeOutcome = Literal["fits", "over", "oom"]


class MemoryProbe(Record):
    """A few real training steps at one batch size, e.g. ``MemoryProbe(batch_size=16, peak_bytes=..., outcome="fits")``.

    ``outcome``: ``fits`` under the target (the limit less the margin), ``over`` it (measured, backed off), or
    ``oom`` (the step ran out of memory or the kernel killed the worker: nothing measured).
    """

    batch_size: int
    peak_bytes: int | None
    outcome: ProbeOutcome
    detail: str | None = None


class MemoryLine(Record):
    """Peak memory as a line in the batch size, ``fixed_bytes + per_sample_bytes * batch``, fitted through
    two probes (``batches``): the model, optimizer state and gradients, then activations and inputs."""

    fixed_bytes: float
    per_sample_bytes: float
    batches: tuple[int, int]

    def predict(self, batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def describe(self) -> str:
        """e.g. ``'12.3 MiB + 2.81 MiB x batch (fitted at batch 4 and 16)'``"""
        return (f"{self.fixed_bytes / 2**20:.1f} MiB + {self.per_sample_bytes / 2**20:.3g} MiB x batch "
                f"(fitted at batch {self.batches[0]} and {self.batches[1]})")


class MaxBatchReport(Record):
    """What ``autotune.max_batch_report`` found: the largest batch confirmed to fit, and the evidence.

    Peaks are what the training steps add (CPU: the process's resident size over its size before them; CUDA /
    XPU: reserved by the caching allocator; MPS: driver-allocated), so ``limit_bytes`` bounds what training
    may take on top of the process that runs it.
    """

    model_kind: str
    candidate: Candidate
    batch_size: int = Field(description="the largest batch whose measured peak stayed under target_bytes")
    peak_bytes: int = Field(description="the peak measured at batch_size")
    limit_bytes: int = Field(description="memory_limit_mb, or the device's free memory, whichever is lower")
    limit_from: Literal["memory_limit_mb", "free memory"]
    free_bytes: int | None = Field(description="the device's free memory before the first probe, if known")
    margin: float
    target_bytes: int = Field(description="limit_bytes x (1 - margin)")
    line: MemoryLine | None = Field(description="fitted at the two smallest probes; None if only one fitted")
    probes: list[MemoryProbe]
    capped: bool = Field(default=False, description="batch_size is the search's upper bound, not a memory limit")
    measured_at: str
    wall_s: float


__all__ = ["MaxBatchReport", "MemoryLine", "MemoryProbe", "OperatorTime", "ProbeOutcome", "TraceReport"]
