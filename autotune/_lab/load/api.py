"""The small interface every platform's reader of CPU time implements (``_proc``, ``_psutil``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MachineTimes:
    """The machine's CPU seconds since boot, summed over its CPUs: busy (not idle, waiting for I/O or stolen),
    stolen by the hypervisor, and all of it."""

    busy_s: float
    steal_s: float
    total_s: float


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
