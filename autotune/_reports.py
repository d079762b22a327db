"""What the loop and the tools report: a training loop's summary (``guard.summary()``), a DataLoader's measurement
(``Config.dataloader_report``), a trace (``trace``) and the largest batch (``max_batch_report``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune._records import Candidate, Record


class LoopSummary(Record):
    """What a training loop's guard saw of the loop's time (``guard.summary()``), kept per family on this machine,
    e.g. ``LoopSummary(model_kind="cnn", candidate=Candidate(device="cpu", precision="bf16-mixed"), steps=1200,
    batches=1200, data_wait_share=0.62, data_ms=75.1, step_ms=46.3, measured_step_ms=45.8, ...)``.

    Per training step, one batch each: the wait for the batch (``guard.data(loader)``) and the rest of the loop's
    time (the step, and whatever else the loop does), timed on the host between batches, with no synchronization
    of the device added.
    """

    model_kind: str
    candidate: Candidate
    steps: int = Field(description="training steps the guard saw (guard.step)")
    batches: int = Field(description="batches guard.data delivered whose step ended")
    data_wait_share: float | None = Field(default=None, description=(
        "the share of the loop's time spent waiting for a batch, e.g. 0.62; None where no batch was timed"))
    data_ms: float | None = Field(default=None, description="ms waiting for data per batch")
    step_ms: float | None = Field(default=None, description="ms of the rest of the loop per batch: the step")
    measured_step_ms: float | None = Field(default=None, description="the step time calibration measured")
    started_at: str = Field(description="when the guard was made, ISO 8601 UTC: the run's identity")
    at: str = Field(description="when this was summed up, ISO 8601 UTC")
    autotune_version: str


class LoaderTrial(Record):
    """One DataLoader setting timed in the loop, e.g. ``LoaderTrial(num_workers=2, num_threads=1, prefetch_factor=2,
    loop_ms=52.0, data_wait_share=0.08, start_s=0.21, batches=14)``, or ruled out (``failure``)."""

    num_workers: int
    num_threads: int | None = Field(default=None, description="the training's CPU threads; None: left as they are")
    prefetch_factor: int | None = None
    loop_ms: float | None = Field(default=None, description="ms per training step of the loop, its data included")
    data_wait_share: float | None = None
    start_s: float | None = Field(default=None, description="until the first batch: the workers' start")
    batches: int = 0
    failure: str | None = Field(default=None, description=(
        "why it was ruled out: a worker died, hung or never started, or workers cannot receive the dataset"))


class LoaderReport(Record):
    """What ``Config.dataloader_report`` measured for one dataset: the DataLoader settings it chose, why, and every
    setting it timed in the loop with the config's recorded step time.

    ``reason`` is one line, e.g. ``"num_workers=2 with 1 training thread: the cheapest setting that kept up with the
    training step (52 ms per step, the step alone 49 ms; without workers 95 ms); measured in 3.1 s (budget 5 s)"``.
    """

    model_kind: str
    candidate: Candidate
    dataset: str = Field(description="the dataset's signature: type, length, one sample's structure")
    batch_size: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    start_method: str = Field(description=(
        "how the measured workers started, as the user's DataLoader starts them, e.g. 'fork': the default start "
        "method, or the multiprocessing_context fixed"))
    num_threads: int | None = Field(default=None, description=(
        "the training's CPU threads the choice was measured with, where it differs from the config's"))
    reason: str
    step_ms: float | None = Field(description=(
        "the training step alone: the step time calibration recorded for the config, at the loader's batch size; "
        "None where none was recorded (the loader was measured alone)"))
    trials: list[LoaderTrial]
    measured_at: str
    wall_s: float = Field(description="what the measurement cost, in seconds")
    budget_s: float

    def tuned(self) -> dict[str, object]:
        """The DataLoader keywords it chose, e.g. ``{"num_workers": 2, "persistent_workers": True, ...}``:
        the keywords that only workers take are left out without them (DataLoader refuses them)."""
        if self.num_workers == 0:
            return {"num_workers": 0, "pin_memory": self.pin_memory}
        chosen: dict[str, object] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                                     "persistent_workers": self.persistent_workers}
        if self.prefetch_factor is not None:
            chosen["prefetch_factor"] = self.prefetch_factor
        return chosen


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


__all__ = [
    "LoaderReport",
    "LoaderTrial",
    "LoopSummary",
    "MaxBatchReport",
    "MemoryLine",
    "MemoryProbe",
    "OperatorTime",
    "ProbeOutcome",
    "TraceReport",
]
