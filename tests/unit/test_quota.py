"""What of the machine this process may use, read from the OS's files as text: its affinity, its cgroup's CPU quota
(v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) and memory limit, the tightest along a nested cgroup path; and the busy
flag weighed against it, on a 96-core host's ``/proc/stat``.

Only the OS boundary is replaced: the affinity, and the files under a temporary root (``autotune._quota.ROOT``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import autotune
from autotune import _fingerprint, _quota
from autotune._lab.host import launch
from autotune._lab.load import MachineTimes, others
from autotune._lab.measure import MeasureSettings, noise
from autotune._records import MachineLoad

#: a v1 host's mounts: cpu and cpuacct mounted together, as Docker, Kubernetes and systemd mount them
V1_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755\n"
    "33 30 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "35 30 0:31 {root} /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory\n"
)
#: a v2 host's mount, without a cgroup namespace: the process sees the whole hierarchy
V2_MOUNTS = "27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
GIB = 2**30


def _files(root: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch, cpus: int = 96) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(_quota, "ROOT", str(root))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)


POD = "sys/fs/cgroup/kubepods.slice/pod1"


@pytest.mark.parametrize(("files", "cores", "usage_s"), [
    pytest.param({"proc/self/cgroup": "0::/\n"}, None, None, id="no-cgroup-files"),
    pytest.param({}, None, None, id="not-linux"),
    pytest.param({"proc/self/cgroup": "0::/kubepods.slice/pod1/ctr\n", "proc/self/mountinfo": V2_MOUNTS,
                  f"{POD}/ctr/cpu.max": "max 100000\n", f"{POD}/cpu.max": "max 100000\n"},
                 None, None, id="v2-unlimited"),
    pytest.param({"proc/self/cgroup": "0::/kubepods.slice/pod1/ctr\n", "proc/self/mountinfo": V2_MOUNTS,
                  f"{POD}/ctr/cpu.max": "max 100000\n", f"{POD}/cpu.max": "150000 100000\n",
                  f"{POD}/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n"},
                 1.5, 2.5, id="v2-a-parents-quota"),
    pytest.param({"proc/self/cgroup": "0::/kubepods.slice/pod1/ctr\n", "proc/self/mountinfo": V2_MOUNTS,
                  f"{POD}/ctr/cpu.max": "100000 100000\n", f"{POD}/cpu.max": "400000 100000\n"},
                 1.0, None, id="v2-the-tighter-own-quota"),
    pytest.param({"proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
                  "proc/self/mountinfo": V1_MOUNTS.format(root="/") + V2_MOUNTS,
                  "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                  "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                  "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpuacct.usage": "1500000000\n",
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
                 0.5, 1.5, id="v1-hybrid"),
    pytest.param({"proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n",
                  "proc/self/mountinfo": V1_MOUNTS.format(root="/docker/abc"),
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
                 2.0, None, id="v1-its-own-cgroup-mounted"),
    pytest.param({"proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n",
                  "proc/self/mountinfo": V1_MOUNTS.format(root="/docker/abc"),
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                  "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
                 None, None, id="v1-unlimited"),
    pytest.param({"proc/self/cgroup": "0::/../other\n", "proc/self/mountinfo": V2_MOUNTS,
                  "sys/fs/cgroup/cpu.max": "100000 100000\n"},
                 None, None, id="a-path-outside-the-mount"),
])
def test_the_cpu_quota_is_the_tightest_along_the_cgroups_path(
        files: dict[str, str], cores: float | None, usage_s: float | None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _files(tmp_path, files, monkeypatch)
    quota = _quota.cpu_quota()
    assert (quota.cores if quota is not None else None) == cores
    assert (quota.used_s() if quota is not None else None) == usage_s
    allows = _quota.allowance()
    assert allows.count == 96 and allows.cpus == frozenset(range(96))
    assert allows.cores == (96 if cores is None else math.ceil(cores))  # a quota of 1.5: 2 cores


def test_every_reader_of_the_usable_cores_reads_the_quota(container: Callable[..., Path]) -> None:
    container(cpus=96, **{"cpu.max": "200000 100000\n"})
    assert _quota.usable_cores() == 2
    assert autotune.fingerprint().usable_cores == 2  # the machine's budget the answers are kept under
    container(cpus=96, **{"cpu.max": "max 100000\n"})
    _fingerprint.forget()  # the budget is read once per process: as a new process would read it
    assert autotune.fingerprint().usable_cores == 96
    container(cpus=96, **{"cpu.max": "100000 100000\n"})
    try:
        launch.start_early()  # one core's worth: a worker started early would slow the host's own imports
        assert launch._early == []
    finally:
        launch.discard()


@pytest.mark.parametrize(("files", "headroom"), [
    pytest.param({"proc/self/cgroup": "0::/app\n", "proc/self/mountinfo": V2_MOUNTS,
                  "sys/fs/cgroup/app/memory.max": f"{4 * GIB}\n", "sys/fs/cgroup/app/memory.current": f"{3 * GIB}\n",
                  "sys/fs/cgroup/app/memory.stat": f"anon 1024\ninactive_file {GIB}\n",
                  "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": f"{5 * GIB}\n"},
                 2 * GIB, id="v2-page-cache-can-go"),
    pytest.param({"proc/self/cgroup": "12:memory:/docker/abc\n",
                  "proc/self/mountinfo": V1_MOUNTS.format(root="/"),
                  "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",
                  "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": f"{GIB}\n",
                  "sys/fs/cgroup/memory/docker/memory.limit_in_bytes": f"{2 * GIB}\n",
                  "sys/fs/cgroup/memory/docker/memory.usage_in_bytes": f"{GIB}\n"},
                 GIB, id="v1-a-parents-limit"),
    pytest.param({"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNTS,
                  "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": f"{GIB}\n"},
                 None, id="v2-unlimited"),
])
def test_the_memory_headroom_is_the_least_along_the_cgroups_path(
        files: dict[str, str], headroom: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _files(tmp_path, files, monkeypatch)
    assert _quota.memory_headroom_bytes() == headroom


# -- the busy flag, weighed against what this process may use -----------------------------------------------------

needs_proc_parser = pytest.mark.skipif(sys.platform == "win32", reason="the /proc/stat parser is POSIX only")


def _stat(busy_ticks: dict[int, int], cpus: int) -> MachineTimes:
    """``/proc/stat`` of a machine of ``cpus`` CPUs after a window of 100 clock ticks, each CPU busy for
    ``busy_ticks`` of them (none where not given), as the parser reads it."""
    from autotune._lab.load import _proc

    lines = [f"cpu{cpu} {busy_ticks.get(cpu, 0)} 0 0 {100 - busy_ticks.get(cpu, 0)} 0 0 0 0 0 0"
             for cpu in range(cpus)]
    busy = sum(busy_ticks.values())
    times = _proc.parse_machine("\n".join([f"cpu  {busy} 0 0 {100 * cpus - busy} 0 0 0 0 0 0", *lines, "intr 1"]))
    assert times is not None
    return times


#: the window: 100 clock ticks (a second at Linux's 100 a second)
WINDOW_S = 100 / os.sysconf("SC_CLK_TCK") if sys.platform != "win32" else 1.0


def _busy(seen: tuple[float, float]) -> bool:
    """Whether ``noise`` flags a window of one second with ``seen`` (cores, share) and a steady control."""
    cores, share = seen
    load = MachineLoad(window_s=1.0, other_cores=cores, other_share=share, steal=0.0)
    return "other_processes" in noise([1.0] * 8, [load], MeasureSettings())


@needs_proc_parser
def test_half_a_core_elsewhere_on_a_96_core_host_does_not_make_a_2_cpu_container_busy(
        container: Callable[..., Path]) -> None:
    # /proc/stat is the host's: 96 CPUs. The worker ran all along on CPU 0 (its own time), another process half of
    # CPU 50. The container may run on all 96 CPUs for two cores' worth: the host's CPUs were 0.5% busy with others,
    # and none of it came out of the container's quota, whose cgroup counted the worker's own time alone.
    group = container(cpus=96, **{"cpu.max": "200000 100000\n", "cpu.stat": "usage_usec 10000000\n"})
    allows = _quota.allowance()
    assert allows.quota is not None and allows.quota.cores == 2.0 and allows.cores == 2
    start_s = allows.quota.used_s()
    assert start_s == 10.0
    before, after = _stat({}, 96), _stat({0: 100, 50: 50}, 96)

    def seen(cgroup_s: float) -> tuple[float, float]:
        assert allows.quota is not None
        (group / "cpu.stat").write_text(f"usage_usec {round((start_s + cgroup_s) * 1e6)}\n")
        used_s = allows.quota.used_s()
        assert used_s is not None
        return others(before, after, own_s=WINDOW_S, elapsed_s=WINDOW_S, allows=allows, quota_used_s=used_s - start_s)

    elsewhere = seen(WINDOW_S)
    assert elsewhere == (0.5, round(0.5 / 96, 3)) and not _busy(elsewhere)
    # the same half core taken by another process in the container: a quarter of its quota
    inside = seen(1.5 * WINDOW_S)
    assert inside == (0.5, 0.25) and _busy(inside)


@needs_proc_parser
@pytest.mark.parametrize(("host", "affinity", "busy_ticks", "cores", "share", "busy"), [
    pytest.param(2, range(2), {1: 50}, 0.5, 0.25, True, id="a-2-core-machine-half-a-core-as-before"),
    pytest.param(2, range(2), {1: 20}, 0.2, 0.1, False, id="a-2-core-machine-a-fifth-of-a-core"),
    pytest.param(96, range(96), {5: 30, 17: 30}, 0.6, 0.006, False, id="a-96-core-machine-its-daemons"),
    pytest.param(96, range(96), dict.fromkeys(range(30), 100), 30.0, 0.312, True, id="a-96-core-machine-a-third-busy"),
    pytest.param(96, range(2), {1: 50, 50: 100, 60: 100}, 0.5, 0.25, True, id="a-cpuset-of-2-the-hosts-counters"),
    pytest.param(96, range(2), {50: 100, 60: 100}, 0.0, 0.0, False, id="a-cpuset-of-2-the-host-busy-elsewhere"),
])
def test_the_others_share_is_of_the_cpus_this_process_may_run_on(
        host: int, affinity: range, busy_ticks: dict[int, int], cores: float, share: float, busy: bool,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _files(tmp_path, {}, monkeypatch, cpus=host)  # no cgroup: no quota
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity), raising=False)
    seen = others(_stat({}, host), _stat(busy_ticks, host), own_s=0.0, elapsed_s=WINDOW_S, allows=_quota.allowance())
    assert seen == (cores, share) and _busy(seen) == busy


@needs_proc_parser
def test_counters_numbered_apart_from_the_affinity_are_read_whole(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # lxcfs writes a container's /proc/stat with its own CPUs renumbered from 0: CPUs 10 and 11 show as cpu0, cpu1
    _files(tmp_path, {}, monkeypatch)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {10, 11}, raising=False)
    seen = others(_stat({}, 2), _stat({1: 60}, 2), own_s=0.0, elapsed_s=WINDOW_S, allows=_quota.allowance())
    assert seen == (0.6, 0.3) and _busy(seen)
