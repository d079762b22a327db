"""The numerics gate on this machine: every candidate's verification errors, per family.

Built-in families and the test suite's numerically hard families (tests/families_for_tests.py). For the
precision-sensitive regression it also times fp32 and bf16 *without* the gate, to show that bf16 is faster
there and that the gate, not speed, is why fp32 is picked.

    python benchmarks/numerics_table.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from _common import BUILTINS, emit, picked

import autotune
from autotune._calibrate import measure_family

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
TEST_FAMILIES = {
    "fp16_overflow": "build_fp16_overflow",
    "precision_sensitive_regression": "build_precision_sensitive_regression",
    "wrong_grad_under_autocast": "build_wrong_grad_under_autocast",
    "fp16_scale_overflow": "build_fp16_scale_overflow",
}


def main() -> None:
    os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-bench-")
    os.environ["AUTOTUNE_SEARCH"] = "precision"  # the gate is the same for variants; keep the table short
    for name, build in TEST_FAMILIES.items():
        autotune.register_family(name, f"families_for_tests:{build}")
    for kind in [*BUILTINS, *TEST_FAMILIES]:
        measured = measure_family(kind)
        for r in measured.candidates:
            n = r.numerics
            emit({
                "benchmark": "numerics", "family": kind, "candidate": r.candidate.label,
                "loss_error": n and round(n.loss_error, 6), "grad_error": n and round(n.grad_error, 6),
                "update_cosine": n and round(n.update_cosine, 4), "tolerance": n and n.tolerance,
                "init_scale": n and n.init_scale, "default_scale_skipped": n and n.default_scale_skipped,
                "outcome": f"{r.failure.kind}: {r.failure.detail}" if r.failure else "passed",
            })
        emit({"benchmark": "numerics", "family": kind, "pick": picked(measured).label})
    unchecked = measure_family("precision_sensitive_regression", verify=False)
    times = {r.candidate.label: round(r.timing.median_ms, 2) for r in unchecked.candidates if r.timing}
    emit({"benchmark": "numerics", "family": "precision_sensitive_regression", "unverified_ms": times,
          "bf16_speedup_if_unchecked": round(times["cpu fp32"] / times["cpu bf16-mixed"], 2)})


if __name__ == "__main__":
    main()
