"""fp32 / tf32 settings across a calibration and in other processes: a calibration in this process leaves the
app's settings as they were, a fresh interpreter round-trips the legacy API, a spawned worker measures with the
host's settings. What each precision means, in this process: tests/unit/test_fp32.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from fp32_for_tests import fp32_state

import autotune


def test_the_new_api_set_by_the_app_breaks_torchs_legacy_getter_but_not_autotune(
    monkeypatch: pytest.MonkeyPatch, tiny_family: str
) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()  # what fingerprint() used to call
    before = fp32_state()
    assert autotune.fingerprint().digest  # reads no fp32 setting: no crash, and the app's settings stay its own
    config = autotune.best_config(tiny_family)  # calibrates in this process: every candidate switches settings
    assert config.source == "measured"
    assert fp32_state() == before


_LEGACY_ROUND_TRIP = """
import torch
from autotune._apply import fp32 as _fp32
host = _fp32.read("legacy")
assert host.values == {"float32_matmul_precision": "highest", "cudnn.allow_tf32": "true"}, host
_fp32.ensure(_fp32.target("tf32", host))
assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
_fp32.ensure(_fp32.target("fp32", host))
assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
assert _fp32.target("fp16-mixed", host) == host
_fp32.ensure(host)
assert _fp32.read("legacy") == host
print("ok")
"""


def test_the_legacy_api_for_builds_without_per_backend_settings() -> None:
    # A fresh interpreter that only ever uses the legacy calls, as on torch < 2.9 (this process mixed them).
    done = subprocess.run([sys.executable, "-c", _LEGACY_ROUND_TRIP], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_worker_measures_with_the_hosts_settings(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A spawned worker: the settings travel in the job. The family raises (a candidate "error") unless fp32 steps
    # run IEEE and mixed-precision steps run the host's TF32 matmuls and convolutions. Every candidate runs at
    # least one step, so one the loaded machine stops as too_slow has still checked its settings.
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker's: two threads stall each other on a busy 2-core host
    autotune.register_family("fp32_settings", "families_for_tests:build_checks_fp32_settings")
    torch.backends.cudnn.fp32_precision = "tf32"  # CUDA's parent setting: matmuls, convolutions and RNNs inherit it
    measured = autotune._calibrate.measure_family("fp32_settings")
    assert {r.candidate.precision for r in measured.candidates} >= {"fp32", "bf16-mixed"}
    errors = [r.failure for r in measured.candidates if r.failure is not None and r.failure.kind == "error"]
    assert not errors
