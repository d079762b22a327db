"""GPU check: a prepared verdict for the day an accelerator is at hand. Exit 0 when every check holds, 1 when
one fails (each is printed).

One command, a few minutes, unchanged on CUDA, ROCm, MPS or XPU (the first accelerator torch can use):

    python benchmarks/gpu_check.py [--out FILE] [--families F ...] [--no-install]

Printed in order, each a JSON line:

1. the machine, the accelerator and the clock check's state: on an NVIDIA GPU without ``nvidia-ml-py`` the
   ``[nvidia]`` extra is installed first (``--no-install``: it is not), and the line says whether NVML's
   throttle reasons can be read, or why not;
2. precision semantics on NVIDIA CUDA, through ``Config.apply_precision``: "fp32" is IEEE for matmuls and
   convolutions, "tf32" is TF32 for both (Ampere and later). The probe is 1 + 2**-12, exact in fp32 and
   rounded to 1 by TF32's 10 mantissa bits, multiplied by 1;
3. a calibration of the families (the built-ins): what was picked, the search notes that say how the
   accelerator was timed and whether its clock check ran, each candidate's peak memory next to its step time;
   no fp32, tf32 or bf16 (where native) accelerator candidate of these healthy families may be rejected by
   the numerics gate;
4. an in-process oracle at loop speed (batches pinned and copied non_blocking, each step timed on the device's
   own clock inside spans: what the calibration's steps are) over the whole space: every variant of each
   device x precision within 3x of the fastest the calibration timed, the others plain. Regret = the pick's
   oracle time / the oracle's best - 1, per family; over ``--max-regret`` fails.

Without an accelerator it says so and checks the same path on the CPU (name a small family to keep it short).
Then copies the store file (real measurements, the store's own format) to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import BUILTINS, emit, oracle, picked, search_space, torch

import autotune
from autotune._apply import fp32 as _fp32
from autotune._records import Candidate, FamilyResult
from autotune.backends import Backend, all_backends
from autotune.backends.cuda import nvidia_hardware_present

#: exact in fp32 (23 mantissa bits), 1.0 after TF32's rounding to 10 mantissa bits
PROBE = 1.0 + 2.0**-12
#: far below the probe's 2**-12 and far above fp32 summation noise on these exact sums
CLOSE = 2.0**-16
#: the [nvidia] extra of pyproject.toml
NVIDIA_EXTRA = "nvidia-ml-py>=11.450"
#: a device x precision this much slower than the fastest the calibration timed is timed plain by the oracle
NEAR = 3.0


def accelerator() -> tuple[Backend, str] | None:
    """The first device of the first accelerator backend torch can use here; None on a CPU-only machine."""
    for backend in all_backends():
        if backend.device_type != "cpu" and backend.unusable_reason() is None and backend.devices():
            return backend, backend.devices()[0]
    return None


def install_nvml(allowed: bool) -> str:
    """Install the [nvidia] extra where an NVIDIA driver is present and the bindings are missing; what happened."""
    if importlib.util.find_spec("pynvml") is not None:
        return "nvidia-ml-py present"
    if not nvidia_hardware_present() or torch.version.hip is not None:
        return "no NVIDIA driver: nothing to install"
    if not allowed:
        return "nvidia-ml-py missing (--no-install)"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", NVIDIA_EXTRA], capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        return f"pip install {NVIDIA_EXTRA} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return f"installed {NVIDIA_EXTRA}"


def _config(device: str, precision: str) -> autotune.Config:
    return autotune.Config(model_kind="gpu_check", device=device, precision=precision,  # type: ignore[arg-type]
                           source="forced", reason="gpu_check", fingerprint_digest="gpu_check")


def _probe_results(device: str) -> tuple[float, float]:
    """(matmul, convolution) of PROBE-filled inputs with ones, on ``device``, under the current settings."""
    x = torch.full((256, 256), PROBE, device=device)
    matmul = float((x @ torch.eye(256, device=device)).max())
    # Large enough that cuDNN's heuristics pick tensor-core kernels when TF32 is allowed.
    image = torch.full((8, 256, 32, 32), PROBE, device=device)
    weight = torch.zeros(256, 256, 1, 1, device=device)
    weight[torch.arange(256), torch.arange(256)] = 1.0  # a 1x1 identity convolution
    conv = float(torch.nn.functional.conv2d(image, weight).max())
    torch.cuda.synchronize()
    return matmul, conv


def precision_checks(device: str) -> list[str]:
    """Problems with what "fp32" and "tf32" mean on an NVIDIA GPU; empty when both are what their labels say."""
    problems = []
    has_tf32 = torch.cuda.get_device_capability(torch.device(device))[0] >= 8
    with _fp32.preserved():
        _config(device, "fp32").apply_precision()
        fp32 = _probe_results(device)
        tf32: tuple[float, float] | None = None
        if has_tf32:
            _config(device, "tf32").apply_precision()
            tf32 = _probe_results(device)
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
    """Built-in families are healthy: the gate must not reject an accelerator candidate whose precision suits
    them."""
    problems = []
    for result in measured.candidates:
        candidate = result.candidate
        if candidate.device == "cpu" or result.failure is None or result.failure.kind != "numerics":
            continue
        native_bf16 = "native bf16" in (result.device_name or "")  # the CUDA backend's name says it
        if candidate.precision in ("fp32", "tf32") or (candidate.precision == "bf16-mixed" and native_bf16):
            problems.append(f"{kind}: {candidate.label} rejected by the numerics gate: {result.failure.detail}")
    return problems


def oracle_space(kind: str, measured: FamilyResult) -> list[Candidate]:
    """The whole search space, but a device x precision more than :data:`NEAR` times slower than the fastest
    the calibration timed is timed plain: its variants cannot come near the best, and on an accelerator
    machine the CPU's would take minutes."""
    timed = {r.candidate: r.timing.median_ms for r in measured.candidates
             if r.candidate == r.candidate.base and r.timing is not None and r.failure is None}
    if not timed:
        return search_space(kind)
    fastest = min(timed.values())
    far = {c for c, ms in timed.items() if ms > NEAR * fastest}
    return [c for c in search_space(kind) if c.base not in far or c == c.base]


def pick_checks(kind: str, measured: FamilyResult, max_regret: float) -> list[str]:
    """The pick against the oracle's fastest of the space, timed side by side here."""
    pick = picked(measured)
    space = oracle_space(kind, measured)
    truth = oracle(kind, extra=[pick], space=space, steps=100)
    best = min(truth, key=truth.__getitem__)
    regret = truth[pick.label] / truth[best] - 1
    emit({"gpu_check": "oracle", "family": kind, "pick": pick.label, "oracle_best": best,
          "regret_pct": round(100 * regret, 1), "timed": len(space),
          "oracle_ms": {k: round(v, 3) for k, v in sorted(truth.items(), key=lambda kv: kv[1])[:8]}})
    if regret > max_regret:
        return [(f"{kind}: picked {pick.label} at {truth[pick.label]:.3g} ms/step, {100 * regret:.0f}% slower than "
                 f"{best} at {truth[best]:.3g} ms/step")]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where to copy the results file")
    parser.add_argument("--families", nargs="+", default=list(BUILTINS), help="default: the built-ins")
    parser.add_argument("--max-regret", type=float, default=0.05,
                        help="a pick this much slower than the oracle's fastest fails the check (default 0.05: the "
                        "3%% margin, its 1%% indifference, and the oracle's own error)")
    parser.add_argument("--no-install", action="store_true", help="do not install the [nvidia] extra")
    args = parser.parse_args()
    started = time.perf_counter()
    installed = install_nvml(not args.no_install)
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-gpu-check-")
    fp = autotune.fingerprint()
    found = accelerator()
    device = found[1] if found is not None else "cpu"
    emit({"gpu_check": "machine", "summary": fp.summary(), "digest": fp.digest, "device": device,
          "accelerators": [a.model_dump() for a in fp.accelerators], "nvidia_ml_py": installed,
          "clock_check": "n/a" if found is None else (found[0].clock_check(device) or "on")})
    if found is None:
        print("gpu_check: no accelerator is visible to this torch build; checking the same path on the CPU",
              file=sys.stderr)
    report = autotune.calibrate(args.families, progress=lambda p: print(
        f"gpu_check: [{100 * p.fraction:3.0f}%] {p.family} {p.candidate or ''}", file=sys.stderr, flush=True))
    emit({"gpu_check": "wall", "calibration_s": round(time.perf_counter() - started, 1)})
    if args.out:
        shutil.copyfile(report.store_path, args.out)
    problems = []
    if device.startswith("cuda"):
        # After calibration: the host must not have initialised CUDA for it (the worker did).
        problems += [] if not torch.cuda.is_initialized() else ["the host initialised CUDA during calibration"]
        if torch.version.hip is None:
            problems += precision_checks(device)
    for kind, config in report.configs.items():
        measured = report.measurements[kind]
        emit({"gpu_check": "decision", "family": kind, "device": config.device, "precision": config.precision,
              "variants": config.candidate.variants, "step_ms": config.step_ms,
              "peak_memory_mb": config.peak_memory_mb, "reason": config.reason, "noisy": measured.noisy,
              "notes": [n for n in measured.search_notes if "clock check" in n or "timed as a training loop" in n
                        or "reported" in n]})
        emit({"gpu_check": "candidates", "family": kind, "ms_and_peak_mib": {
            r.candidate.label: (round(r.timing.median_ms, 3) if r.timing else r.failure.kind if r.failure else None,
                                None if r.peak_bytes is None else round(r.peak_bytes / 2**20, 1),
                                None if r.peak_reserved_bytes is None else round(r.peak_reserved_bytes / 2**20, 1))
            for r in measured.candidates}})
        problems += gate_checks(kind, measured)
        problems += pick_checks(kind, measured, args.max_regret)
    emit({"gpu_check": "verdict", "ok": not problems, "device": device, "problems": problems,
          "wall_s": round(time.perf_counter() - started, 1)})
    for problem in problems:
        print(f"gpu_check: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
