"""Wall time of a full cold calibration, per family and for all of them, against ``import torch``.

One cold ``autotune.calibrate()`` of the families (one worker for all of them, as an app's first launch
runs it), in a fresh cache. Printed per family: its wall time, the worker start it waited for, its cost in
step-equivalents per candidate ((wall - worker start) / sum of the candidates' median step times, a
candidate stopped after its first step counting with that step; one stopped by its probe, before any step,
not at all), wall / ``import torch`` in a fresh process, timed in the same run, so the figure compares across
machines, and whether the calibration was flagged noisy (it is then measured again by the next calibrate()).

With ``--cli``, also the command a newcomer runs first, ``python -m autotune --recalibrate``, in a fresh process
and a fresh cache: its wall time from the shell (the host's own ``import torch`` included, which the early
worker start overlaps) and that wall over ``import torch``.

    python benchmarks/calibration_cost.py [--cli] [FAMILY ...]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import emit, families_from_argv

import autotune
from autotune._decide import decide


def import_torch_s(runs: int = 3) -> float:
    """Median wall time of ``python -c "import torch"`` in a fresh process."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def cli_s(kinds: list[str]) -> float:
    """Wall time of ``python -m autotune --recalibrate --json`` for ``kinds`` in a fresh process and cache."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": tempfile.mkdtemp(prefix="autotune-bench-")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autotune", "--recalibrate", "--json",
                           *(word for kind in kinds for word in ("--family", kind))], check=False, capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"python -m autotune --recalibrate failed ({done.returncode}):\n{done.stderr}")
    return time.perf_counter() - started


def main() -> None:
    cli = "--cli" in sys.argv
    if cli:
        sys.argv.remove("--cli")
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    torch_s = import_torch_s()
    kinds = families_from_argv()
    if cli:
        command_s = cli_s(kinds)
        emit({"benchmark": "calibration_cost", "family": "CLI", "families": kinds, "wall_s": round(command_s, 2),
              "import_torch_s": round(torch_s, 2), "wall_over_import_torch": round(command_s / torch_s, 2)})
    report = autotune.calibrate(kinds)
    per_candidate = []
    for kind in kinds:
        measured = report.measurements[kind]
        step_ms = [
            r.timing.median_ms if r.timing else r.first_step_ms
            for r in measured.candidates if r.timing or r.first_step_ms
        ]
        equivalents = 1000 * (measured.wall_s - measured.worker_start_s) / sum(step_ms)
        per_candidate.append(equivalents)
        emit({
            "benchmark": "calibration_cost", "family": kind, "wall_s": round(measured.wall_s, 2),
            "worker_start_s": round(measured.worker_start_s, 2), "candidates": len(measured.candidates),
            "step_equivalents_per_candidate": round(equivalents, 1),
            "wall_over_import_torch": round(measured.wall_s / torch_s, 2),
            "pick": " ".join([decide(measured, digest="-").precision, *decide(measured, digest="-").variants]),
            "noisy": measured.noisy,
        })
    emit({"benchmark": "calibration_cost", "family": "ALL", "wall_s": round(report.wall_s, 2),
          "import_torch_s": round(torch_s, 2), "wall_over_import_torch": round(report.wall_s / torch_s, 2),
          "mean_step_equivalents_per_candidate": round(statistics.fmean(per_candidate), 1)})


if __name__ == "__main__":
    main()
