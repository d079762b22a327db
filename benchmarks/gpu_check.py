"""GPU check: calibrate the built-in families on a CUDA machine, print the decisions, keep the results file.

One command, a few minutes on any CUDA GPU (bf16 fp16 and tf32 candidates included):

    python benchmarks/gpu_check.py --out fixtures/machines/h200.json

Prints one JSON line per family (device, precision, ms/step, reason) and one with the whole calibration's
wall time, then copies the store file (real measurements, the store's own format) to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from _common import BUILTINS, emit, torch

import autotune


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where to copy the results file")
    args = parser.parse_args()
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-gpu-check-")
    fp = autotune.fingerprint()
    emit({"gpu_check": "machine", "summary": fp.summary(), "digest": fp.digest,
          "accelerators": [a.model_dump() for a in fp.accelerators]})
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible to this torch build; nothing to check", file=sys.stderr)
        return 1
    started = time.perf_counter()
    report = autotune.calibrate(list(BUILTINS), progress=lambda p: print(
        f"gpu_check: [{100 * p.fraction:3.0f}%] {p.family} {p.candidate or ''}", file=sys.stderr, flush=True))
    for kind, config in report.configs.items():
        measured = report.measurements[kind]
        emit({"gpu_check": "decision", "family": kind, "device": config.device, "precision": config.precision,
              "step_ms": config.step_ms, "speedup_vs_fp32_cpu": config.speedup_vs_fp32_cpu, "reason": config.reason,
              "candidates": {r.candidate.label: (r.timing.median_ms if r.timing else f"{r.failure.kind}")
                             for r in measured.candidates if r.timing or r.failure}})
    emit({"gpu_check": "wall", "calibration_s": round(time.perf_counter() - started, 1)})
    if args.out:
        shutil.copyfile(report.store_path, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
