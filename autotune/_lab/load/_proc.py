"""Linux: CPU time from ``/proc``, the machine's (``/proc/stat``), each process's (``/proc/<pid>/stat``), and
whether this process's other threads are running now (``/proc/self/task/<tid>/stat``).

Times in ``/proc`` count clock ticks (``SC_CLK_TCK``, 100 a second): a window of a fraction of a second reads
them to a few hundredths of a core. The parsing is kept apart from the reading, so it can be tested on text.
"""

from __future__ import annotations

import os
import sys
import threading

from autotune._lab.load.api import MachineTimes

assert sys.platform != "win32", "no /proc on Windows: autotune._lab.load reads psutil there"  # mypy: POSIX only

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def parse_machine(text: str) -> MachineTimes | None:
    """``/proc/stat``'s ``cpu`` line (user nice system idle iowait irq softirq steal ...), summed over the CPUs,
    in seconds: steal and all of it; and each ``cpuN`` line's busy seconds (not idle, iowait or steal). None if
    the ``cpu`` line is not there."""
    summed: tuple[float, float] | None = None
    per_cpu: dict[int, float] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu"):
            continue
        ticks = ([int(v) for v in fields[1:9]] + [0] * 8)[:8]
        user, nice, system, _, _, irq, softirq, steal = ticks
        if fields[0] == "cpu":
            summed = steal * _TICK_S, sum(ticks) * _TICK_S
        elif fields[0][3:].isdigit():
            per_cpu[int(fields[0][3:])] = (user + nice + system + irq + softirq) * _TICK_S
    return MachineTimes(steal_s=summed[0], total_s=summed[1], cpu_busy_s=per_cpu) if summed is not None else None


def parse_process(text: bytes) -> tuple[str, str, float]:
    """A ``/proc/<pid>/stat`` line: (name, state, CPU seconds in user and system mode). The name sits between
    the first ``(`` and the last ``)``: it may hold spaces and parentheses itself."""
    head, _, tail = text.rpartition(b")")
    fields = tail.split()
    return (head.partition(b"(")[2].decode(errors="replace"), fields[0].decode(),
            (int(fields[11]) + int(fields[12])) * _TICK_S)


def machine() -> MachineTimes | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return parse_machine(f.read())
    except (OSError, ValueError):
        return None


def _stat(path: str) -> tuple[str, str, float] | None:
    try:
        with open(path, "rb") as f:
            return parse_process(f.read())
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
        return None


def processes() -> dict[int, tuple[str, float]]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(f"/proc/{name}/stat")) is not None:
            found[int(name)] = (stat[0], stat[2])
    return found


def cpu_s(pid: int) -> float | None:
    stat = _stat(f"/proc/{pid}/stat")
    return stat[2] if stat is not None else None


def threads_running() -> bool | None:
    """Whether a thread of this process other than the caller is running or ready to run (state ``R``)."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task") if int(t) != me]
    except OSError:
        return None
    return any((stat := _stat(f"/proc/self/task/{tid}/stat")) is not None and stat[1] == "R" for tid in tids)
