"""Does the busy flag mean busy? ``python -m autotune`` in fresh caches, on a quiet machine and beside a busy loop.

Quiet: ``--runs`` runs (default 5) of ``python -m autotune --json``, the README's first command, each in a fresh
cache; per family, in how many runs it was flagged noisy, and why. Busy: the same runs again, each with a busy loop
pinned to one core started ``--start-after`` seconds into the command (default: a third of the quiet runs' median
wall time); for the families that finished after the loop started, how many were flagged and in how many the
evidence names the loop (its pid among the processes of a timing window), counted twice: every family that
finished after the loop started, and those wholly measured beside it (started after it). One JSON line per run,
then a summary line per phase.

Idle (``--phase idle``, not part of ``both``): no calibration at all, the control workload alone, timed as a
calibration times it (the pause, the least of three) ``--controls`` times per window of ``--window-s`` seconds
(a family's calibration), the time between spent spinning in this process; per window, whether the control's rule
alone would flag it and what the operating system saw. The share of idle windows flagged is the floor of the quiet
phase's rate on this machine: a host whose speed moves under a quiet guest (a virtual machine's neighbours, its
clocks) moves the control with nothing running.

Issue #38's acceptance: quiet, no family flagged in 4 or more of 5 runs; busy, the flag on at least 9 of 10 such
calibrations, the evidence naming the loop. Run it on a quiet machine: it measures the machine it runs on.

    python benchmarks/busy_flag.py [--runs N] [--start-after S] [--phase quiet|busy|both|idle]
                                   [--windows N] [--window-s S] [--controls N] [FAMILY ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import emit

from autotune._cache.store import Store
from autotune._lab.child import Control
from autotune._lab.load import Watch, settle
from autotune._lab.measure import MeasureSettings, control_shifted, timed
from autotune._stats import level_shift

BUSY_LOOP = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def run_cli(kinds: list[str], *, busy_after_s: float | None) -> dict[str, Any]:
    """One ``python -m autotune --json`` in a fresh cache; with ``busy_after_s``, a busy loop pinned to the last
    core starts that long after the command and runs until it ends."""
    cache = tempfile.mkdtemp(prefix="autotune-busy-")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": cache}
    command = [sys.executable, "-m", "autotune", "--json", *(word for kind in kinds for word in ("--family", kind))]
    started = time.perf_counter()
    cli = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loop, loop_at = None, None
    if busy_after_s is not None:
        try:
            cli.wait(timeout=busy_after_s)
        except subprocess.TimeoutExpired:
            core = max(os.sched_getaffinity(0))
            loop = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)])
            loop_at = dt.datetime.now(dt.timezone.utc)
    out, err = cli.communicate()
    wall_s = time.perf_counter() - started
    if loop is not None:
        loop.kill()
        loop.wait()
    if cli.returncode != 0:
        raise SystemExit(f"python -m autotune failed ({cli.returncode}):\n{err}")
    json.loads(out)  # the command's answer is well-formed
    families = {}
    for stored in Store(Path(cache)).all_files():
        for kind, measured in stored.families.items():
            ended = dt.datetime.fromisoformat(measured.measured_at)
            named = {p.pid for load in measured.loads for p in load.processes}
            families[kind] = {
                "noisy": measured.noisy, "why": measured.noisy_because,
                "beside_loop": loop_at is not None and ended > loop_at,
                "wholly_beside_loop": loop_at is not None and ended - dt.timedelta(seconds=measured.wall_s) > loop_at,
                "names_loop": loop is not None and loop.pid in named,
            }
    return {"wall_s": round(wall_s, 1), "busy_loop_pid": loop.pid if loop is not None else None,
            "families": families}


def idle_window(seconds: float, controls: int) -> dict[str, Any]:
    """The control alone for ``seconds``: ``controls`` measurements as a calibration takes them, the time between
    spent spinning (this process's own CPU time, which no window counts as another's)."""
    settings = MeasureSettings()
    control = Control()
    for _ in range(3):
        control.run()
    window = Watch(host=None).open()
    control_ms = []
    for _ in range(controls):
        until = time.perf_counter() + seconds / controls
        while time.perf_counter() < until:
            pass
        settle(settings.settle_s)
        control_ms.append(1000 * min(timed(control, time.perf_counter) for _ in range(3)))
    load = window.close()
    shift, own = level_shift(control_ms)
    return {"flagged": control_shifted(control_ms, settings), "shift": round(shift, 3), "own_noise": round(own, 3),
            "other_cores": load.other_cores if load else None, "other_share": load.other_share if load else None,
            "steal": load.steal if load else None,
            "control_ms": [round(ms, 3) for ms in control_ms]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--start-after", type=float, default=None, help="seconds into each busy run")
    parser.add_argument("--phase", choices=["quiet", "busy", "both", "idle"], default="both")
    parser.add_argument("--windows", type=int, default=20, help="idle phase: how many windows")
    parser.add_argument("--window-s", type=float, default=15.0, help="idle phase: seconds per window")
    parser.add_argument("--controls", type=int, default=14, help="idle phase: control measurements per window")
    parser.add_argument("family", nargs="*")
    args = parser.parse_args(argv)
    kinds = args.family or ["tiny_mlp", "mlp", "cnn", "transformer"]
    walls = []
    if args.phase == "idle":
        results = []
        for index in range(args.windows):
            results.append(idle_window(args.window_s, args.controls))
            emit({"benchmark": "busy_flag", "phase": "idle", "window": index, "window_s": args.window_s,
                  **results[-1]})
        every = [ms for result in results for ms in result["control_ms"]]
        fast = min(every)
        emit({"benchmark": "busy_flag", "phase": "idle", "windows": args.windows, "window_s": args.window_s,
              "flagged": sum(result["flagged"] for result in results),
              "with_os_evidence": sum((result["other_share"] or 0) >= MeasureSettings().busy_other_share
                                      or (result["steal"] or 0) >= MeasureSettings().busy_steal
                                      for result in results),
              "controls_over_1.4x_fastest": round(sum(ms > 1.4 * fast for ms in every) / len(every), 3),
              "max_steal": max((result["steal"] or 0 for result in results), default=0)})
    if args.phase in ("quiet", "both"):
        flagged: Counter[str] = Counter()
        why: Counter[str] = Counter()
        for index in range(args.runs):
            result = run_cli(kinds, busy_after_s=None)
            walls.append(result["wall_s"])
            emit({"benchmark": "busy_flag", "phase": "quiet", "run": index, **result})
            for kind, family in result["families"].items():
                flagged[kind] += family["noisy"]
                why.update(family["why"])
        emit({"benchmark": "busy_flag", "phase": "quiet", "runs": args.runs, "flagged": dict(flagged),
              "why": dict(why), "families_flagged_in_4_of_5_or_more": sorted(
                  kind for kind, count in flagged.items() if count >= 0.8 * args.runs)})
    if args.phase in ("busy", "both"):
        start_after = args.start_after or (statistics.median(walls) / 3 if walls else 15.0)
        counts = {which: Counter[str]() for which in ("beside_loop", "wholly_beside_loop")}
        for index in range(args.runs):
            result = run_cli(kinds, busy_after_s=start_after)
            emit({"benchmark": "busy_flag", "phase": "busy", "run": index, "start_after_s": start_after, **result})
            for family in result["families"].values():
                for which, count in counts.items():
                    if family[which]:
                        count.update(calibrations=1, flagged=int(family["noisy"]), names_loop=int(family["names_loop"]))
        emit({"benchmark": "busy_flag", "phase": "busy", "runs": args.runs, "start_after_s": start_after,
              **{which: dict(count) for which, count in counts.items()}})


if __name__ == "__main__":
    main(sys.argv[1:])
