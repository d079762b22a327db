"""The CPU time Linux control groups allow this process, read from ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` and the cgroup files they point to.

cgroup v2 keeps the limit in ``cpu.max`` (``"150000 100000"``: 1.5 cores' worth per period; ``"max 100000"``: none),
v1 in ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (a quota of ``-1``: none). Container runtimes set them
(``docker run --cpus``, a Kubernetes CPU limit). A limit on any group up to the hierarchy's root holds for the
groups below it, so the tightest on the way counts. Kept apart so the parsing can be tested on files as text.
"""

from __future__ import annotations

import re
from pathlib import Path


def cpu_quota(proc: str = "/proc/self") -> float | None:
    """Cores' worth of CPU time this process's control groups allow, e.g. ``1.5``; None without a limit, or where
    there are no control groups to read (not Linux)."""
    try:
        groups = Path(proc, "cgroup").read_text(encoding="utf-8", errors="replace")
        mounts = Path(proc, "mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    limits = [limit for group, top in _cpu_directories(groups, mounts) for limit in _limits(group, top)]
    return round(min(limits), 2) if limits else None


def _cpu_directories(groups: str, mounts: str) -> list[tuple[Path, Path]]:
    """(the process's group directory, its hierarchy's mount point) for v2 and v1's ``cpu`` controller."""
    paths: dict[str, str] = {}  # "" for v2, "cpu" for v1's cpu controller -> the group's path
    for line in groups.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        if controllers == "":
            paths[""] = group
        elif "cpu" in controllers.split(","):
            paths["cpu"] = group
    found = []
    for line in mounts.splitlines():
        fields, _, tail = line.partition(" - ")
        head, kinds = fields.split(), tail.split()
        if len(head) < 5 or len(kinds) < 3:
            continue
        root, point = _unescaped(head[3]), Path(_unescaped(head[4]))
        if kinds[0] == "cgroup2":
            path = paths.get("")
        elif kinds[0] == "cgroup" and "cpu" in kinds[2].split(","):
            path = paths.get("cpu")
        else:
            continue
        if path is None:
            continue
        # The group's path is from the hierarchy's root; the mount shows the part under ``root`` (a container
        # sees its own group as the mount point).
        inside = path[len(root):] if root == "/" or path == root or path.startswith(root + "/") else ""
        found.append((point / inside.lstrip("/"), point))
    return found


def _limits(group: Path, top: Path) -> list[float]:
    """The limits of ``group`` and of each group above it up to ``top`` (its hierarchy's mount point), in cores."""
    found = []
    for directory in (group, *group.parents):
        if not directory.is_relative_to(top):
            break
        limit = _limit(directory)
        if limit is not None:
            found.append(limit)
    return found


def _limit(group: Path) -> float | None:
    try:
        quota, period = (group / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (group / "cpu.cfs_quota_us").read_text().strip()
            period = (group / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        cores = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):  # v2's "max": no limit
        return None
    return cores if cores > 0 else None  # v1's -1: no limit


def _unescaped(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)
