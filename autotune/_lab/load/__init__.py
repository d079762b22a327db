"""What the operating system says about the machine while candidates are timed, and what the worker does so that
its own threads and its host do not pass for a busy machine.

- A timing window (:meth:`Watch.open`) reads the machine's CPU time, the worker's own and every process's at its
  start and its end: the CPU time the other processes took of what the worker may use (:func:`others`), which
  ones took the most, and the share the hypervisor took for other machines (steal). A result is flagged noisy on
  that evidence, or on a control workload that moved well past its own noise (``measure.noise``).
- :func:`settle` pauses, on the CPU, until this process's other threads stop running. OpenMP's thread pool
  spin-waits after every parallel region (GNU libgomp, which torch's CPU wheels use: ``GOMP_SPINCOUNT``, by
  default 300,000 spins, a few milliseconds), and a pool thread spinning on the same physical core (a
  hyper-threaded sibling: a 2-vCPU cloud machine is one core) slows the control measured right after an
  all-thread candidate, but not after a one-thread one. A thread that sleeps instead wakes up slower.
- The worker waits once, before it times anything, until its host is done with its own start-up
  (:meth:`Watch.wait_for_host`): the host importing torch or building an app's model is not the machine the
  user has.

Linux reads ``/proc`` (``_proc``); elsewhere psutil, where it is installed (``_psutil``); without either the
operating system says nothing (None), and only the control can flag a result.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import time
from collections.abc import Iterator, Sequence

from autotune._lab.load.api import MachineTimes, Reader
from autotune._quota import Allowance, allowance
from autotune._records import MachineLoad, ProcessLoad
from autotune._wording import printable

#: the longest :func:`settle` waits for this process's threads to stop running: a spin counted in iterations
#: lasts longer on a loaded machine; Intel's OpenMP spins 200 ms by default (``KMP_BLOCKTIME``), and the control
#: is then measured beside a spinning pool, after every candidate alike
SETTLE_MAX_S = 0.05
#: the host counts as done with its start-up once it uses less than this share of a core ...
HOST_QUIET_CORES = 0.25
#: ... over a sample this long; and the worker waits for that at most this long (an app that trains while it
#: calibrates in the background is never done: its results then say so)
HOST_SAMPLE_S = 0.2
HOST_WAIT_MAX_S = 10.0
#: a window shorter than this reads too few clock ticks to tell a core's share: the operating system says nothing
MIN_WINDOW_S = 0.2
#: the other processes a window names: the few that took the most, from this share of a core up
PROCESSES_NAMED = 3
PROCESS_FLOOR_CORES = 0.05


@functools.cache
def reader() -> Reader | None:
    """This platform's reader of CPU times, chosen once: ``/proc`` on Linux, else psutil where installed."""
    if sys.platform.startswith("linux") and os.path.exists("/proc/stat"):
        from autotune._lab.load import _proc

        return _proc
    if importlib.util.find_spec("psutil") is not None:
        from autotune._lab.load import _psutil

        return _psutil
    return None


def settle(seconds: float) -> None:
    """Pause ``seconds`` on the CPU, then until this process's other threads stop running (a thread pool
    spin-waiting after a candidate's parallel region; at most :data:`SETTLE_MAX_S`): the control that follows
    measures the machine, not the candidate before it. Where thread states cannot be read, the pause alone."""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        pass
    source = reader()
    while time.perf_counter() - started < SETTLE_MAX_S and source is not None and source.threads_running():
        pass


class Window:
    """One timing window: what the machine, the worker's cgroup, the worker and every other process had used at
    its start. ``mine``: processes whose CPU time counts as the worker's own (a job's copies of the timed step);
    ``allows``: what the worker may use (read at the start when not given)."""

    def __init__(self, source: Reader | None, host: int | None, mine: Sequence[int] = (),
                 allows: Allowance | None = None) -> None:
        self.source = source
        self.host = host
        self.mine = tuple(mine)
        self.allows = allows if allows is not None else allowance()
        self.started = time.perf_counter()
        self.own_s = self._own_s()
        self.machine = source.machine() if source is not None else None
        self.quota_s = self._quota_s()
        self.processes = source.processes() if source is not None else {}

    def _quota_s(self) -> float | None:
        return self.allows.quota.used_s() if self.allows.quota is not None else None

    def _own_s(self) -> float:
        mine = [self.source.cpu_s(pid) for pid in self.mine] if self.source is not None else []
        return time.process_time() + sum(cpu_s for cpu_s in mine if cpu_s is not None)

    def so_far(self) -> MachineLoad | None:
        """The machine's load since the window opened, without naming processes (cheap: read at every look)."""
        return self._load(named=False)

    def close(self) -> MachineLoad | None:
        """The machine's load over the whole window, naming the other processes that took the most."""
        return self._load(named=True)

    def _load(self, *, named: bool) -> MachineLoad | None:
        elapsed = time.perf_counter() - self.started
        if self.source is None or elapsed < MIN_WINDOW_S:
            return None
        own_s = self._own_s() - self.own_s
        machine = self.source.machine()
        other_cores = other_share = steal = None
        if machine is not None and self.machine is not None:
            quota_s = self._quota_s()
            other_cores, other_share = others(
                self.machine, machine, own_s=own_s, elapsed_s=elapsed, allows=self.allows,
                quota_used_s=quota_s - self.quota_s if quota_s is not None and self.quota_s is not None else None)
            steal = _steal(self.machine, machine)
        processes: list[ProcessLoad] = []
        host_cores = None
        if named:
            now = self.source.processes()
            me = os.getpid()
            used = {pid: (name, cpu_s - self.processes.get(pid, (name, 0.0))[1])
                    for pid, (name, cpu_s) in now.items() if pid != me and pid not in self.mine}
            if self.host is not None and self.host in used:
                host_cores = round(used[self.host][1] / elapsed, 3)
            busiest = sorted(used.items(), key=lambda item: -item[1][1])[:PROCESSES_NAMED]
            # A process's name is its owner's to choose (any user's, escape sequences included), and reasons name it.
            processes = [ProcessLoad(name=printable(name), pid=pid, cores=round(cpu_s / elapsed, 3),
                                     host=pid == self.host)
                         for pid, (name, cpu_s) in busiest if cpu_s / elapsed >= PROCESS_FLOOR_CORES]
        return MachineLoad(window_s=round(elapsed, 3), other_cores=other_cores, other_share=other_share, steal=steal,
                           host_cores=host_cores, processes=processes)


def others(before: MachineTimes, after: MachineTimes, *, own_s: float, elapsed_s: float, allows: Allowance,
           quota_used_s: float | None = None) -> tuple[float, float]:
    """(cores, share): the CPU time other processes took between two readings of what this process may use, in
    cores and as a share of it; the larger of two shares is the evidence:

    - of the CPUs it may run on: those of its affinity where the counters number them alike (the machine's own, or
      a container's whose ``/proc/stat`` is the host's: only its own CPUs are read), else all the counters count
      (a ``/proc/stat`` numbered apart, as lxcfs writes one); the CPU time on them less its own, over how many;
    - of its CPU quota, where one holds it to fewer cores than those CPUs and its cgroup's usage is read
      (``quota_used_s``): the cgroup's CPU time less its own, over the quota. A process in the same ``--cpus=2``
      container takes from the same two cores' worth; one elsewhere on the host's other cores does not.

    E.g. half a core of a 2-core machine: a share of 0.25; in a container held to 2 CPUs on a 96-core host whose
    counters it reads, half a core taken elsewhere on the host: 0.005, taken in its own cgroup: 0.25."""
    counted = before.cpu_busy_s.keys() & after.cpu_busy_s.keys()
    cpus = allows.cpus if allows.cpus is not None and allows.cpus <= counted else counted
    busy_s = sum(after.cpu_busy_s[cpu] - before.cpu_busy_s[cpu] for cpu in cpus)
    cores = max(0.0, busy_s - own_s) / elapsed_s
    share = cores / max(1, len(cpus))
    quota = allows.quota
    if quota is not None and quota_used_s is not None and quota.cores < len(cpus):
        quota_cores = max(0.0, quota_used_s - own_s) / elapsed_s
        if quota_cores / quota.cores > share:
            cores, share = quota_cores, quota_cores / quota.cores
    return round(cores, 3), round(share, 3)


def _steal(before: MachineTimes, after: MachineTimes) -> float:
    """The hypervisor's share of the machine's CPU time between two readings."""
    total = after.total_s - before.total_s
    return round((after.steal_s - before.steal_s) / total, 4) if total > 0 else 0.0


class Watch:
    """The operating system's view for one worker's timing windows. ``host``: the worker's host process (None
    when the calibration runs in the host's own process)."""

    def __init__(self, *, host: int | None) -> None:
        self.host = host
        self._waited = False
        self._mine: tuple[int, ...] = ()
        self._allows = allowance()

    def open(self) -> Window:
        return Window(reader(), self.host, self._mine, self._allows)

    @contextlib.contextmanager
    def counting(self, pids: Sequence[int]) -> Iterator[Watch]:
        """Within the block, the CPU time of ``pids`` (a job's copies of the timed step, which run beside it by
        design) counts as the worker's own, not as another process's that makes the machine busy."""
        before, self._mine = self._mine, (*self._mine, *pids)
        try:
            yield self
        finally:
            self._mine = before

    def wait_for_host(self) -> float:
        """Once per worker: wait until the host uses less than :data:`HOST_QUIET_CORES` of a core (its imports,
        an app's start-up), at most :data:`HOST_WAIT_MAX_S`; the seconds waited past the first sample (0 when the
        host was quiet already)."""
        source = reader()
        if self._waited or self.host is None or source is None:
            return 0.0
        self._waited = True
        first = None
        while True:
            before, at = source.cpu_s(self.host), time.perf_counter()
            time.sleep(HOST_SAMPLE_S)
            after, now = source.cpu_s(self.host), time.perf_counter()
            first = now if first is None else first
            if (before is None or after is None or (after - before) / (now - at) < HOST_QUIET_CORES
                    or now - first >= HOST_WAIT_MAX_S):
                return now - first


__all__ = [
    "HOST_QUIET_CORES", "HOST_SAMPLE_S", "HOST_WAIT_MAX_S", "MIN_WINDOW_S", "PROCESSES_NAMED", "PROCESS_FLOOR_CORES",
    "SETTLE_MAX_S", "MachineTimes", "Reader", "Watch", "Window", "others", "reader", "settle",
]
