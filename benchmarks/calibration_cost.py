"""Wall time of a full cold calibration per family, and its cost in step-equivalents per candidate.

step-equivalents per candidate = (wall - one worker start) / sum of the candidates' median step times,
where a candidate stopped after its first step counts with that step's time. The worker's start (a fresh
interpreter importing torch, ~3 s here) is timed inside the same calibration and reported separately.

    python benchmarks/calibration_cost.py [FAMILY ...]
"""

from __future__ import annotations

import os
import statistics
import tempfile

from _common import emit, families_from_argv

import autotune
from autotune._api import measure_family


def main() -> None:
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    per_candidate = []
    total_wall = 0.0
    for kind in families_from_argv():
        measured = measure_family(kind)
        step_ms = [
            r.timing.median_ms if r.timing else r.first_step_ms
            for r in measured.candidates if r.timing or r.first_step_ms
        ]
        equivalents = 1000 * (measured.wall_s - measured.worker_start_s) / sum(step_ms)
        per_candidate.append(equivalents)
        total_wall += measured.wall_s
        emit({
            "benchmark": "calibration_cost", "family": kind, "wall_s": round(measured.wall_s, 2),
            "worker_start_s": round(measured.worker_start_s, 2), "candidates": len(measured.candidates),
            "step_equivalents_per_candidate": round(equivalents, 1),
            "pick": f"{autotune._decide.decide(measured, digest='-').precision}",
        })
    emit({"benchmark": "calibration_cost", "family": "ALL", "wall_s": round(total_wall, 2),
          "mean_step_equivalents_per_candidate": round(statistics.fmean(per_candidate), 1)})


if __name__ == "__main__":
    main()
