"""Checks that need a real accelerator; skipped cleanly on CPU-only machines (CI)."""

from __future__ import annotations

import pytest
import torch

import autotune

has_cuda = torch.cuda.is_available()
pytestmark = pytest.mark.gpu


def test_host_never_initialises_cuda_for_calibration() -> None:
    # On every machine: the worker probes devices, the host must not (an app may fork DataLoader workers later).
    autotune.best_config("tiny_mlp")
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU")
def test_cuda_candidates_are_measured_and_native_bf16_is_reported() -> None:
    autotune.calibrate(["cnn"])
    measured = autotune._api.cached_families(["cnn"])["cnn"]
    cuda = [r for r in measured.candidates if r.candidate.device.startswith("cuda")]
    assert {r.candidate.precision for r in cuda} >= {"fp32", "bf16-mixed", "fp16-mixed"}
    assert all(r.usable for r in cuda if r.candidate.precision == "fp32")
    assert any("compute capability" in (r.device_name or "") for r in cuda)
    assert not torch.cuda.is_initialized()
