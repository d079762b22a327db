"""GPU check: a verdict on a CUDA machine. Exit 0 when every check holds, 1 when one fails (each is printed).

One command, a few minutes on any CUDA GPU (bf16 fp16 and tf32 candidates included):

    python benchmarks/gpu_check.py --out fixtures/machines/h200.json

Checks, in order, each printed as a JSON line:

1. precision semantics, through ``Config.apply_precision`` (the calibration worker applies the same settings):
   "fp32" is IEEE for matmuls and convolutions, "tf32" is TF32 for both (Ampere and later). The probe is
   1 + 2**-12, exact in fp32 and rounded to 1 by TF32's 10 mantissa bits, multiplied by 1.
2. calibration of the built-in families: no fp32, tf32 or bf16 (where native) CUDA candidate of these healthy
   families is rejected by the numerics gate, and the pick is at most ``--max-regret`` slower than the fastest
   device x precision timed side by side in this process afterwards (the oracle of benchmarks/_common.py).

Then copies the store file (real measurements, the store's own format) to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from _common import BUILTINS, emit, oracle, picked, torch

import autotune
from autotune import _fp32
from autotune._lab.plan import plan
from autotune._records import FamilyResult

#: exact in fp32 (23 mantissa bits), 1.0 after TF32's rounding to 10 mantissa bits
PROBE = 1.0 + 2.0**-12
#: far below the probe's 2**-12 and far above fp32 summation noise on these exact sums
CLOSE = 2.0**-16


def _config(precision: str) -> autotune.Config:
    return autotune.Config(model_kind="gpu_check", device="cuda:0", precision=precision,  # type: ignore[arg-type]
                           source="forced", reason="gpu_check", fingerprint_digest="gpu_check")


def _probe_results() -> tuple[float, float]:
    """(matmul, convolution) of PROBE-filled inputs with ones, on cuda:0, under the current settings."""
    x = torch.full((256, 256), PROBE, device="cuda:0")
    matmul = float((x @ torch.eye(256, device="cuda:0")).max())
    # Large enough that cuDNN's heuristics pick tensor-core kernels when TF32 is allowed.
    image = torch.full((8, 256, 32, 32), PROBE, device="cuda:0")
    weight = torch.zeros(256, 256, 1, 1, device="cuda:0")
    weight[torch.arange(256), torch.arange(256)] = 1.0  # a 1x1 identity convolution
    conv = float(torch.nn.functional.conv2d(image, weight).max())
    torch.cuda.synchronize()
    return matmul, conv


def precision_checks() -> list[str]:
    """Problems with what "fp32" and "tf32" mean on cuda:0; empty when both are what their labels say."""
    problems = []
    has_tf32 = torch.version.hip is None and torch.cuda.get_device_capability(0)[0] >= 8
    with _fp32.preserved():
        _config("fp32").apply_precision()
        fp32 = _probe_results()
        tf32: tuple[float, float] | None = None
        if has_tf32:
            _config("tf32").apply_precision()
            tf32 = _probe_results()
    emit({"gpu_check": "precision", "api": _fp32.api(), "probe": PROBE, "fp32_matmul_conv": fp32,
          "tf32_matmul_conv": tf32, "settings_after": _fp32.current().values})
    for op, value in zip(("matmul", "convolution"), fp32, strict=True):
        if abs(value - PROBE) > CLOSE:
            problems.append(f"fp32 {op} is not IEEE: {PROBE!r} x 1 gave {value!r}")
    if tf32 is not None:
        for op, value in zip(("matmul", "convolution"), tf32, strict=True):
            if abs(value - 1.0) > CLOSE:
                problems.append(f"tf32 {op} is not TF32: {PROBE!r} x 1 gave {value!r}, TF32 rounds it to 1.0")
    return problems


def gate_checks(kind: str, measured: FamilyResult) -> list[str]:
    """Built-in families are healthy: the gate must not reject a CUDA candidate whose precision suits them."""
    problems = []
    for result in measured.candidates:
        candidate = result.candidate
        if not candidate.device.startswith("cuda") or result.failure is None or result.failure.kind != "numerics":
            continue
        native_bf16 = "native bf16" in (result.device_name or "")
        if candidate.precision in ("fp32", "tf32") or (candidate.precision == "bf16-mixed" and native_bf16):
            problems.append(f"{kind}: {candidate.label} rejected by the numerics gate: {result.failure.detail}")
    return problems


def pick_checks(kind: str, measured: FamilyResult, max_regret: float) -> list[str]:
    """The pick against every planned device x precision (and the pick itself), timed side by side here."""
    pick = picked(measured)
    planned, _ = plan()
    truth = oracle(kind, extra=[pick], space=planned, steps=50)
    best = min(truth, key=truth.__getitem__)
    regret = truth[pick.label] / truth[best] - 1
    emit({"gpu_check": "oracle", "family": kind, "pick": pick.label, "oracle_best": best,
          "regret_pct": round(100 * regret, 1), "oracle_ms": {k: round(v, 3) for k, v in truth.items()}})
    if regret > max_regret:
        return [(f"{kind}: picked {pick.label} at {truth[pick.label]:.3g} ms/step, {100 * regret:.0f}% slower than "
                 f"{best} at {truth[best]:.3g} ms/step")]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where to copy the results file")
    parser.add_argument("--max-regret", type=float, default=0.15,
                        help="a pick this much slower than the oracle's fastest fails the check (default 0.15)")
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
    emit({"gpu_check": "wall", "calibration_s": round(time.perf_counter() - started, 1)})
    if args.out:
        shutil.copyfile(report.store_path, args.out)
    # After calibration: the host must not have initialised CUDA for it (the worker did).
    problems = [] if not torch.cuda.is_initialized() else ["the host initialised CUDA during calibration"]
    problems += precision_checks()
    for kind, config in report.configs.items():
        measured = report.measurements[kind]
        emit({"gpu_check": "decision", "family": kind, "device": config.device, "precision": config.precision,
              "step_ms": config.step_ms, "speedup_vs_fp32_cpu": config.speedup_vs_fp32_cpu, "reason": config.reason,
              "candidates": {r.candidate.label: (r.timing.median_ms if r.timing else f"{r.failure.kind}")
                             for r in measured.candidates if r.timing or r.failure}})
        problems += gate_checks(kind, measured)
        problems += pick_checks(kind, measured, args.max_regret)
    emit({"gpu_check": "verdict", "ok": not problems, "problems": problems})
    for problem in problems:
        print(f"gpu_check: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
