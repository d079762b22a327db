"""Checks that need a real accelerator; skipped cleanly on CPU-only machines (CI)."""

from __future__ import annotations

import pytest
import torch

import autotune
from autotune import Config
from autotune._answer import cached_families
from autotune._apply import fp32 as _fp32
from autotune._apply.axes import copies_non_blocking

has_cuda = torch.cuda.is_available()
has_tf32 = has_cuda and torch.version.hip is None and torch.cuda.get_device_capability(0)[0] >= 8
pytestmark = pytest.mark.gpu

#: exact in fp32, 1.0 after TF32 rounds it to 10 mantissa bits
PROBE = 1.0 + 2.0**-12


def _cuda_config(precision: str) -> Config:
    return Config(model_kind="gpu", device="cuda:0", precision=precision, source="forced",  # type: ignore[arg-type]
                  reason="test", fingerprint_digest="d")


def _matmul_and_conv() -> tuple[float, float]:
    x = torch.full((256, 256), PROBE, device="cuda:0")
    image = torch.full((8, 256, 32, 32), PROBE, device="cuda:0")
    weight = torch.zeros(256, 256, 1, 1, device="cuda:0")
    weight[torch.arange(256), torch.arange(256)] = 1.0
    return (float((x @ torch.eye(256, device="cuda:0")).max()),
            float(torch.nn.functional.conv2d(image, weight).max()))


def test_host_never_initialises_cuda_for_calibration() -> None:
    # On every machine: the worker probes devices, the host must not (an app may fork DataLoader workers later).
    autotune.best_config("tiny_mlp")
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU")
def test_cuda_candidates_are_measured_and_native_bf16_is_reported() -> None:
    autotune.calibrate(["cnn"])
    measured = cached_families(["cnn"])["cnn"]
    cuda = [r for r in measured.candidates if r.candidate.device.startswith("cuda")]
    assert {r.candidate.precision for r in cuda} >= {"fp32", "bf16-mixed", "fp16-mixed"}
    assert all(r.usable for r in cuda if r.candidate.precision == "fp32")
    described = "gfx" if torch.version.hip is not None else "compute capability"
    assert any(described in (r.device_name or "") for r in cuda)
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(not has_tf32, reason="needs an NVIDIA GPU with TF32 (Ampere or later)")
def test_fp32_is_ieee_and_tf32_is_tf32_for_matmuls_and_convolutions() -> None:
    with _fp32.preserved():
        _cuda_config("fp32").apply_precision()
        assert _matmul_and_conv() == pytest.approx((PROBE, PROBE), abs=2**-16)
        _cuda_config("tf32").apply_precision()
        assert _matmul_and_conv() == pytest.approx((1.0, 1.0), abs=2**-16)


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU")
def test_only_pinned_batches_copy_non_blocking_and_arrive_intact() -> None:
    config = _cuda_config("fp32")
    pinned, pageable = torch.arange(1000.0).pin_memory(), torch.arange(1000.0)
    assert copies_non_blocking(pinned.device, torch.device("cuda:0"), pinned=pinned.is_pinned())
    assert not copies_non_blocking(pageable.device, torch.device("cuda:0"), pinned=pageable.is_pinned())
    moved = config.prepare_batch({"pinned": pinned, "pageable": pageable})
    torch.cuda.synchronize()
    assert torch.equal(moved["pinned"].cpu(), pinned) and torch.equal(moved["pageable"].cpu(), pageable)


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU")
def test_fused_optimizers_are_built_on_cuda_and_rmsprop_without_it() -> None:
    model, optimizer = Config.model_validate({**_cuda_config("fp32").model_dump(), "optimizer": "fused"}).prepare(
        torch.nn.Linear(4, 2), torch.optim.SGD, lr=0.1)
    assert optimizer.defaults["fused"] is True
    model(torch.randn(3, 4, device="cuda:0")).sum().backward()
    optimizer.step()
    _, rmsprop = Config.model_validate({**_cuda_config("fp32").model_dump(), "optimizer": "fused"}).prepare(
        torch.nn.Linear(4, 2), torch.optim.RMSprop)
    assert not rmsprop.defaults.get("fused")


@pytest.mark.skipif(not (has_cuda and torch.version.hip is not None), reason="needs a ROCm GPU")
def test_rocm_gpus_are_named_by_architecture_in_the_fingerprint() -> None:
    accelerators = autotune.fingerprint().accelerators
    assert accelerators and all(a.name.startswith("AMD gfx") for a in accelerators)
    assert autotune.fingerprint().hip == torch.version.hip


@pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU")
def test_a_candidates_peak_memory_leaves_out_the_candidates_still_held() -> None:
    # The same candidate set up twice in one lab: the second's peak, with the first's model, optimizer state and
    # cached blocks on the device, is its own (it used to include the first's).
    from autotune._families import get_family
    from autotune._lab.prepare import TorchLab
    from autotune._lab.protocol import CalibrationSettings
    from autotune._records import Candidate

    lab = TorchLab(get_family("cnn"), CalibrationSettings(verify=False), probe=False)
    candidate = Candidate(device="cuda:0", precision="fp32")
    first = lab.set_up(candidate)
    second = lab.set_up(candidate)
    assert first.result.peak_bytes and second.result.peak_bytes
    assert second.result.peak_bytes <= 1.1 * first.result.peak_bytes
