"""Elsewhere (macOS, Windows), where psutil is installed: the machine's CPU time and each process's, through it.

Thread states are not read here: a thread's state is not something psutil reports on every system.
"""

from __future__ import annotations

import psutil

from autotune._lab.load.api import MachineTimes

#: what ``psutil.cpu_times()`` counts as not busy; guest time is counted in user time already (Linux)
_IDLE = ("idle", "iowait", "steal")
_COUNTED_TWICE = ("guest", "guest_nice")


def machine() -> MachineTimes | None:
    times = psutil.cpu_times()._asdict()
    per_cpu = {index: _busy(cpu._asdict()) for index, cpu in enumerate(psutil.cpu_times(percpu=True))}
    return MachineTimes(steal_s=times.get("steal", 0.0), total_s=_total(times), cpu_busy_s=per_cpu)


def _total(times: dict[str, float]) -> float:
    return sum(v for k, v in times.items() if k not in _COUNTED_TWICE)


def _busy(times: dict[str, float]) -> float:
    return _total(times) - sum(times.get(k, 0.0) for k in _IDLE)


def processes() -> dict[int, tuple[str, float]]:
    found = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        times = process.info.get("cpu_times")
        if times is not None:  # None: access denied
            found[process.pid] = (process.info.get("name") or "?", times.user + times.system)
    return found


def cpu_s(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(times.user + times.system)


def threads_running() -> bool | None:
    return None
