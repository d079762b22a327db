"""Linux: whether this process's other threads are running now (``/proc/self/task/<tid>/stat``).

The parsing is kept apart from the reading, so it can be tested on text.
"""

from __future__ import annotations

import os
import threading


def parse_process(text: bytes) -> tuple[str, str]:
    """A ``/proc/<pid>/stat`` line: (name, state). The name sits between the first ``(`` and the last ``)``: it
    may hold spaces and parentheses itself."""
    head, _, tail = text.rpartition(b")")
    return head.partition(b"(")[2].decode(errors="replace"), tail.split()[0].decode()


def _stat(path: str) -> tuple[str, str] | None:
    try:
        with open(path, "rb") as f:
            return parse_process(f.read())
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
        return None


def threads_running() -> bool | None:
    """Whether a thread of this process other than the caller is running or ready to run (state ``R``)."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task") if int(t) != me]
    except OSError:
        return None
    return any((stat := _stat(f"/proc/self/task/{tid}/stat")) is not None and stat[1] == "R" for tid in tids)
