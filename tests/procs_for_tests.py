"""Worker processes seen at the OS boundary (/proc, Linux): what a test asserts about processes it cannot see
from Python."""

from __future__ import annotations

from pathlib import Path

from autotune._lab.measure import MeasureSettings
from autotune._lab.protocol import CalibrationSettings

#: a calibration a worker test can afford: precisions only, a fifth of a second to time them
SETTINGS = CalibrationSettings(search="precision", measure=MeasureSettings(budget_s=0.2))


def workers_of(pid: int) -> list[int]:
    """Calibration worker processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"autotune._lab.entry" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
