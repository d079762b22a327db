"""The small interface every platform's reader of CPU time implements (``_proc``, ``_psutil``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MachineTimes:
    """The machine's CPU seconds since boot, summed over its CPUs: stolen by the hypervisor, and all of it; and
    each CPU's busy seconds (not idle, waiting for I/O or stolen), by the id the counters give it (in a container
    whose counters are the host's, the host's CPUs, numbered as the container's affinity numbers them)."""

    steal_s: float
    total_s: float
    cpu_busy_s: Mapping[int, float]


class Reader(Protocol):
    def machine(self) -> MachineTimes | None:
        """The machine's CPU times now; None where they cannot be read."""

    def processes(self) -> dict[int, tuple[str, float]]:
        """Every process this user may read: pid -> (name, CPU seconds so far)."""

    def cpu_s(self, pid: int) -> float | None:
        """One process's CPU seconds so far; None once it is gone."""

    def threads_running(self) -> bool | None:
        """Whether a thread of this process other than the caller is running now; None where it cannot tell."""


__all__ = ["MachineTimes", "Reader"]
