"""Peak memory per candidate, and how close ``max_batch_size`` comes to the largest batch that really fits (#15).

1. One calibration of the built-ins (in a fresh cache): each candidate's peak MiB next to its step time.
2. For ``cnn`` and ``transformer`` at each limit L: ``max_batch_report(kind, memory_limit_mb=L)`` on the
   picked candidate (its answer, the peak it measured there, its time), the answer's peak measured again in
   another worker, and the largest batch whose measured peak stays under L, found slowly: batches grown from
   the answer until one goes over, then bisected to one batch, every one of them real training steps
   (the same probe, no line). ``ratio`` = answer / that batch; the issue's target is >= 0.8.

Peaks are what training adds to the worker process (the CPU: its resident size's rise, with glibc's mmap
threshold pinned in the probe worker). ``answer_peak_default_malloc_mib`` is the answer's peak in a fresh
process with glibc as it comes (no pin): what an app that does not set ``MALLOC_MMAP_THRESHOLD_`` may see.

    python benchmarks/max_batch.py [--no-table] [LIMIT_MB ...]      (default 256 512 1024)

``--no-table`` skips the calibration table and reuses ``AUTOTUNE_CACHE_DIR``'s calibration when set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch
from _common import BUILTINS, emit

import autotune
from autotune._apply import fp32 as _fp32
from autotune._families import get_family
from autotune._lab.host.worker import Worker
from autotune._lab.protocol import MemoryProbed, MemoryProbeJob
from autotune._records import Candidate
from autotune._reports import MaxBatchReport

MARGIN = 0.15


def _peak_table() -> None:
    started = time.perf_counter()
    report = autotune.calibrate(list(BUILTINS), force=True)
    emit({"benchmark": "max_batch", "what": "calibration", "wall_s": round(time.perf_counter() - started, 1)})
    for kind, measured in report.measurements.items():
        pick = report.configs[kind].candidate
        for r in measured.candidates:
            emit({"benchmark": "max_batch", "what": "peak", "kind": kind, "candidate": r.candidate.label,
                  "picked": r.candidate == pick,
                  "peak_mib": round(r.peak_bytes / 2**20, 1) if r.peak_bytes is not None else None,
                  "step_ms": round(r.timing.median_ms, 2) if r.timing else None,
                  "first_step_ms": round(r.first_step_ms, 1) if r.first_step_ms is not None else None,
                  "outcome": r.failure.kind if r.failure else ("dropped" if r.timing and r.timing.dropped else "ok")})


def _probe(worker: Worker, kind: str, candidate: Candidate, batch_size: int) -> MemoryProbed:
    return worker.run_memory_probe(MemoryProbeJob(
        family=get_family(kind), candidate=candidate, init_scale=None,
        batch_size=batch_size, fp32=_fp32.current(), threads=torch.get_num_threads(),
        sys_path=[p for p in sys.path if p]))


def _peak(probed: MemoryProbed) -> int | None:
    return probed.peak_reserved_bytes if probed.peak_reserved_bytes is not None else probed.peak_bytes


def _largest_under(kind: str, limit_bytes: int, start: int, candidate: Candidate) -> tuple[int, int, int]:
    """(largest batch whose peak stayed under the limit, its peak, probes run): grow, then bisect."""
    peaks: dict[int, int | None] = {}

    def fits(batch: int) -> bool:
        probed = _probe(worker, kind, candidate, batch)
        peak = peaks[batch] = _peak(probed)
        return probed.failure is None and peak is not None and peak <= limit_bytes

    with Worker(isolation="subprocess", timeout_s=600) as worker:
        low = start
        while not fits(low) and low > 1:
            low = max(1, low * 3 // 4)
        high = max(low + 1, int(low * 1.25))
        while fits(high):
            low, high = high, int(high * 1.25) + 1
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    return low, peaks[low] or 0, len(peaks)


def _limits(kind: str, limits_mb: list[float]) -> None:
    for limit_mb in limits_mb:
        started = time.perf_counter()
        report = autotune.max_batch_report(kind, memory_limit_mb=limit_mb, margin=MARGIN, force=True)
        answer_s = time.perf_counter() - started
        target = limit_mb * 2**20 * (1 - MARGIN)
        started = time.perf_counter()
        best, best_peak, probes = _largest_under(kind, int(limit_mb * 2**20), report.batch_size, report.candidate)
        search_s = time.perf_counter() - started
        again = _remeasure(kind, report)
        default_malloc = _remeasure_default_malloc(kind, report)
        emit({"benchmark": "max_batch", "what": "max_batch", "kind": kind, "candidate": report.candidate.label,
              "limit_mb": limit_mb, "target_mib": round(target / 2**20, 1), "answer": report.batch_size,
              "answer_peak_mib": round(report.peak_bytes / 2**20, 1),
              "answer_peak_again_mib": round(again / 2**20, 1) if again is not None else None,
              "answer_peak_default_malloc_mib": round(default_malloc / 2**20, 1) if default_malloc else None,
              "under_target": report.peak_bytes <= target,
              "line": report.line.describe() if report.line else None,
              "answer_probes": [(p.batch_size, round(p.peak_bytes / 2**20, 1) if p.peak_bytes else None, p.outcome)
                                for p in report.probes],
              "answer_s": round(answer_s, 1), "largest_under_limit": best, "its_peak_mib": round(best_peak / 2**20, 1),
              "ratio": round(report.batch_size / best, 3), "exhaustive_probes": probes,
              "exhaustive_s": round(search_s, 1)})


def _remeasure(kind: str, report: MaxBatchReport) -> int | None:
    """The answer's peak in a fresh worker, as the app's first run at that batch would see it."""
    with Worker(isolation="subprocess", timeout_s=600) as worker:
        return _peak(_probe(worker, kind, report.candidate, report.batch_size))


_DEFAULT_MALLOC = """
import sys
from autotune._lab.max_batch import probe_memory
from autotune._lab.protocol import MemoryProbeJob
print(probe_memory(MemoryProbeJob.model_validate_json(sys.stdin.read())).model_dump_json())
"""


def _remeasure_default_malloc(kind: str, report: MaxBatchReport) -> int | None:
    """The answer's peak in a fresh process that leaves glibc's allocator as it comes."""
    job = MemoryProbeJob(family=get_family(kind), candidate=report.candidate,
                         init_scale=None, batch_size=report.batch_size, fp32=_fp32.current(),
                         threads=torch.get_num_threads(), sys_path=[p for p in sys.path if p])
    out = subprocess.run([sys.executable, "-c", _DEFAULT_MALLOC], input=job.model_dump_json(), text=True,
                         capture_output=True, check=True).stdout
    return _peak(MemoryProbed.model_validate_json(out.strip().splitlines()[-1]))


def main() -> None:
    args = sys.argv[1:]
    table = "--no-table" not in args
    limits_mb = [float(a) for a in args if a != "--no-table"] or [256.0, 512.0, 1024.0]
    if table or not os.environ.get("AUTOTUNE_CACHE_DIR"):
        os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-max-batch-")
    if table:
        _peak_table()
    for kind in ("cnn", "transformer"):
        _limits(kind, limits_mb)


if __name__ == "__main__":
    main()
