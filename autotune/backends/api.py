"""The interface every backend implements (platformdirs' ``api.py`` pattern): backend modules import
this, never the package, so nothing imports back up."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from autotune._records import ClockEvent, Precision, Record


class Accelerator(Record):
    """What the host can see of an accelerator without initialising it, e.g. ``name='NVIDIA H200'``."""

    backend: str
    name: str
    driver: str | None = None


class Finding(Record):
    """One ``--doctor`` diagnosis, e.g. ``level='error', message='NVIDIA driver found but ...', fix='install ...'``."""

    level: Literal["ok", "info", "warning", "error"]
    message: str
    fix: str | None = None


class ClockReading(Record):
    """A device's clock now and what holds it down, e.g. ``mhz=1755.0, events=['power_cap']``."""

    mhz: float | None = None
    events: list[ClockEvent] = Field(default_factory=list)


class StepClock:
    """Markers in a device's queue, timed on the device's own clock as the queue reaches them (CUDA, XPU and MPS
    events): the time between two steps' ends as a loop that never waits for the device runs them."""

    def __init__(self, new_event: Callable[[], Any], record: Callable[[Any], None]) -> None:
        self._new_event = new_event
        self._record = record
        self._events: list[Any] = []

    def mark(self) -> None:
        """Put a marker at the end of the device's queue (after the work launched so far)."""
        event = self._new_event()
        self._record(event)
        self._events.append(event)

    def intervals_s(self) -> list[float]:
        """Seconds between consecutive markers; read once the device is synchronised."""
        return [first.elapsed_time(second) / 1000 for first, second in itertools.pairwise(self._events)]


class Backend(ABC):
    """Availability, devices, precisions worth trying, synchronisation and OOM detection for one backend, and
    the facts the rest of the package asks of a device type (copies, profiler, frameworks, environment)."""

    name: ClassVar[str]
    #: what users call it, e.g. ``'Intel XPU'``
    title: ClassVar[str]
    #: torch's device type for ``torch.autocast`` / ``torch.amp.GradScaler``
    device_type: ClassVar[str]
    #: whether a copy from pinned host memory to this device is stream-ordered and keeps its source alive, so a
    #: batch may be copied ``non_blocking``
    async_copies: ClassVar[bool] = False
    #: whether work is queued to the device and runs while the host launches more: a training loop's launches
    #: then overlap its device time, and a timed sample must span several steps between two synchronisations
    asynchronous: ClassVar[bool] = False
    #: ``lightning.Trainer(accelerator=...)`` for this device; None where Lightning has no built-in accelerator
    lightning_accelerator: ClassVar[str | None]
    #: whether Lightning trains on this device in one process only (its DDP does not take the device)
    lightning_one_process: ClassVar[bool] = False
    #: whether a guard's replay forks this device's random state (``torch.random.fork_rng``) to leave the app's as
    #: it was
    forks_rng: ClassVar[bool] = False
    #: environment variables that choose which of its devices a process sees, and in which order
    visible_device_variables: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def host_accelerators(self) -> list[Accelerator]:
        """Cheap, side-effect-free facts for the fingerprint; must not initialise the device."""

    @abstractmethod
    def unusable_reason(self) -> str | None:
        """None when this backend can run candidates here; otherwise why not, in plain words."""

    @abstractmethod
    def devices(self) -> list[str]:
        """Device strings, one candidate each, e.g. ``['cuda:0', 'cuda:1']``."""

    @abstractmethod
    def precisions(self, device: str) -> list[Precision]:
        """The precisions worth measuring on ``device``; facts propose, measurement decides."""

    @abstractmethod
    def device_name(self, device: str) -> str:
        """Human name, e.g. ``'NVIDIA GeForce RTX 3090'``."""

    def synchronize(self, device: str) -> None:  # noqa: B027 - a default: the CPU has nothing to wait for
        """Wait for queued work; a no-op on the CPU."""

    def apply_loop_settings(self) -> None:  # noqa: B027 - a default: most backends have none
        """Set what a fast training loop on this backend runs with, process-wide (NVIDIA CUDA: cuDNN's
        benchmark mode): before every timed step of its candidates, and in ``Config.apply_precision``."""

    def step_clock(self, device: str) -> StepClock | None:
        """A fresh :class:`StepClock` on ``device``; None where the device keeps no clock of its own (the CPU) or
        this torch build cannot time its events."""
        return None

    def clock_check(self, device: str) -> str | None:
        """None where :meth:`clock_reading` can say what holds ``device``'s clocks down; otherwise why not."""
        return f"{self.title} reports no clock events"

    def clock_reading(self, device: str) -> ClockReading | None:
        """The device's clock now and the throttle reasons in force (where :meth:`clock_check` is None)."""
        return None

    def release_cached_memory(self, device: str) -> None:  # noqa: B027 - a default: the CPU has no cache
        """Return the caching allocator's free blocks to the device, so the next candidate starts clean."""

    def reset_peak_memory(self, device: str) -> None:  # noqa: B027 - a default: not every backend tracks one
        """Start a new peak-memory window where the backend tracks one, at what is live now, with the cached
        blocks given back first: the models and optimizer states of other candidates still held stay out of
        the next one's peak, and it reuses none of their blocks."""

    def peak_memory_bytes(self, device: str) -> int | None:
        """The most memory the work since ``reset_peak_memory`` added at once to what was live then (CPU: the
        resident size; CUDA / XPU: allocated; MPS: driver-allocated); None where the backend cannot tell."""
        return None

    def peak_reserved_bytes(self, device: str) -> int | None:
        """The most memory the caching allocator took from the device since the reset, over what it held then
        (allocated plus cached blocks: what the device really gave); None for backends without such an
        allocator."""
        return None

    def free_memory_bytes(self, device: str) -> int | None:
        """What new allocations on ``device`` can still get now, e.g. 20 GiB; None where the OS does not say."""
        return None

    def profiler_activity(self) -> torch.profiler.ProfilerActivity | None:
        """The ``torch.profiler`` activity that records this device's kernels; None where there is none."""
        return None

    def diagnose(self) -> list[Finding]:
        """What ``--doctor`` reports here: hardware this torch build cannot use, settings that skew timing."""
        return []

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        # The CPU allocator reports exhaustion as a plain RuntimeError ("DefaultCPUAllocator: can't allocate").
        text = str(exc).lower()
        return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


__all__ = ["Accelerator", "Backend", "ClockReading", "Finding", "StepClock"]
