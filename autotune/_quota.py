"""What of the machine this process may use: the CPUs it may run on (its affinity) and, on Linux, its cgroup's CPU
quota and memory limit.

A ``docker run --cpus=2`` on a 96-core host may run on all 96 CPUs, two cores' worth of time at once: thread pools
and DataLoader workers sized by the affinity would ask for 48 times that. The cgroup is read from
``/proc/self/cgroup`` and ``/proc/self/mountinfo``, its limits from the cgroup file system (v2 ``cpu.max``,
``memory.max``; v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, ``memory.limit_in_bytes``), the tightest
along its path up to the mount: a limit may sit on a parent (a Kubernetes pod's, a systemd slice's). Everything is
read under :data:`ROOT`. Imports nothing of torch: the worker's launcher reads it before torch is loaded.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

#: where ``/proc`` and the cgroup file system are read from; tests point it at a directory of text files
ROOT = "/"
#: a v1 memory limit this large is none (the kernel's "unlimited" is a page count's maximum, in bytes)
_NO_LIMIT_BYTES = 2**60


@dataclass(frozen=True)
class CpuQuota:
    """A cgroup's CPU quota, e.g. ``CpuQuota(cores=1.5, usage_path='/sys/fs/cgroup/cpu.stat')`` for ``cpu.max``
    ``150000 100000``: its processes together get 1.5 cores' worth of time."""

    cores: float
    #: the file that counts the CPU time of that cgroup's processes (v2 ``cpu.stat``, v1 ``cpuacct.usage`` where
    #: cpuacct is mounted with cpu, as Docker, Kubernetes and systemd mount it); None where there is none
    usage_path: str | None

    def used_s(self) -> float | None:
        """The CPU seconds that cgroup's processes have used so far; None where it cannot be read."""
        if self.usage_path is None or (text := _read(self.usage_path)) is None:
            return None
        if self.usage_path.endswith("cpu.stat"):
            usec = _fields(text).get("usage_usec")
            return usec / 1e6 if usec is not None else None
        try:
            return int(text) / 1e9
        except ValueError:
            return None


@dataclass(frozen=True)
class Allowance:
    """The CPUs this process may use, e.g. ``Allowance(cpus=frozenset(range(96)), count=96, quota=CpuQuota(2.0,
    ...))`` in a ``--cpus=2`` container on a 96-core host."""

    #: the ids of the CPUs it may run on (its affinity); None where the operating system does not say
    cpus: frozenset[int] | None
    #: how many CPUs it may run on
    count: int
    quota: CpuQuota | None

    @property
    def cores(self) -> int:
        """The cores it may keep busy at once, e.g. 2: its CPUs, fewer where its quota allows fewer (a quota of
        1.5 cores: 2, as the Go runtime and the JVM round it)."""
        if self.quota is None:
            return self.count
        return max(1, min(self.count, math.ceil(self.quota.cores)))


def allowance() -> Allowance:
    """This process's CPUs and CPU quota, read now (``taskset`` and cgroups may change them while it runs)."""
    if hasattr(os, "sched_getaffinity"):
        cpus = frozenset(os.sched_getaffinity(0))
        return Allowance(cpus=cpus, count=len(cpus), quota=cpu_quota())
    # macOS, Windows: the OS does not say which CPUs, nor does it hold a process to fewer
    return Allowance(cpus=None, count=os.cpu_count() or 1, quota=cpu_quota())


def usable_cores() -> int:
    """The cores this process may keep busy at once, e.g. 2 (see :attr:`Allowance.cores`)."""
    return allowance().cores


def cpu_quota() -> CpuQuota | None:
    """The tightest CPU quota on this process's cgroup and its parents; None where none is set (or no cgroup)."""
    version, dirs = _cgroup("cpu")
    found: CpuQuota | None = None
    for directory in dirs:
        if version == 2:
            cores = _cores_v2(_read(posixpath.join(directory, "cpu.max")))
            usage = posixpath.join(directory, "cpu.stat")
        else:
            cores = _cores_v1(_read(posixpath.join(directory, "cpu.cfs_quota_us")),
                              _read(posixpath.join(directory, "cpu.cfs_period_us")))
            usage = posixpath.join(directory, "cpuacct.usage")
        if cores is not None and (found is None or cores < found.cores):
            found = CpuQuota(cores=cores, usage_path=usage if os.path.exists(usage) else None)
    return found


def memory_headroom_bytes() -> int | None:
    """What this process's cgroup may still take before its memory limit (or a parent's), the least along its
    path: the limit less what is in use, page cache the kernel can drop not counted as in use (as Kubernetes
    counts a container's working set); None where no limit is set (or no cgroup)."""
    version, dirs = _cgroup("memory")
    names = (("memory.max", "memory.current", "inactive_file") if version == 2 else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    found: int | None = None
    for directory in dirs:
        limit, usage = (_number(_read(posixpath.join(directory, name))) for name in names[:2])
        if limit is None or usage is None or limit >= _NO_LIMIT_BYTES:
            continue
        inactive = _fields(_read(posixpath.join(directory, "memory.stat")) or "").get(names[2], 0)
        headroom = max(0, limit - max(0, usage - inactive))
        found = headroom if found is None else min(found, headroom)
    return found


# -- reading the cgroup ---------------------------------------------------------------------------------------


def _cgroup(controller: str) -> tuple[int, list[str]]:
    """The version (1 or 2) of the cgroup hierarchy holding ``controller`` and this process's directories in it,
    its own first and up to the mount's; none where there is no cgroup file system (not Linux) or the path lies
    outside it."""
    own = _read(posixpath.join(ROOT, "proc/self/cgroup"))
    mounts = _read(posixpath.join(ROOT, "proc/self/mountinfo"))
    if own is None or mounts is None:
        return 2, []
    paths = {}
    for line in own.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif controller in controllers.split(","):
            paths[1] = path
    version = 1 if 1 in paths else 2  # a hybrid system's v1 hierarchy holds the controllers it lists
    if version not in paths or ".." in paths[version].split("/"):
        return version, []  # none, or a cgroup outside this process's cgroup namespace: not in its view
    for mount_root, mount_point in _mounts(mounts, version, controller):
        relative = posixpath.relpath(paths[version], mount_root)
        if relative == ".." or relative.startswith("../"):
            continue  # a mount of another part of the hierarchy
        top = posixpath.normpath(posixpath.join(ROOT, mount_point.lstrip("/")))
        return version, list(_up_to(posixpath.normpath(posixpath.join(top, relative)), top))
    return version, []


def _mounts(mountinfo: str, version: int, controller: str) -> Iterator[tuple[str, str]]:
    """(root in the hierarchy, mount point) of each mount of the cgroup hierarchy: a ``mountinfo`` line is ``id
    parent dev root point options [optional fields] - type source super-options``."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, described = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(described) < 3:
            continue
        if (version == 2 and described[0] == "cgroup2") or (
                version == 1 and described[0] == "cgroup" and controller in described[2].split(",")):
            yield fields[3], fields[4]


def _up_to(directory: str, top: str) -> Iterator[str]:
    while True:
        yield directory
        if directory == top or len(directory) <= len(top):
            return
        directory = posixpath.dirname(directory)


def _cores_v2(text: str | None) -> float | None:
    """``cpu.max``: ``'200000 100000'`` -> 2.0; ``'max 100000'`` -> None (no quota)."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = _number(parts[0]), _number(parts[1])
    return quota / period if quota is not None and period else None


def _cores_v1(quota_text: str | None, period_text: str | None) -> float | None:
    """``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``: 150000 / 100000 -> 1.5; a quota of -1 -> None."""
    quota, period = _number(quota_text), _number(period_text)
    return quota / period if quota is not None and quota > 0 and period else None


def _number(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:  # "max", empty, or not there
        return None


def _fields(text: str) -> dict[str, int]:
    """``'usage_usec 1234\\nuser_usec 1000\\n'`` -> ``{'usage_usec': 1234, 'user_usec': 1000}``"""
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if (number := _number(value)) is not None:
            found[name] = number
    return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


__all__ = ["ROOT", "Allowance", "CpuQuota", "allowance", "cpu_quota", "memory_headroom_bytes", "usable_cores"]
