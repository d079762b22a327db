from __future__ import annotations

import pytest
import torch

import autotune
from autotune import Config
from autotune._apply import fp32 as _fp32


def _config(precision: str, init_scale: float | None = None) -> Config:
    return Config(model_kind="cnn", device="cpu", precision=precision, source="measured",  # type: ignore[arg-type]
                  reason="test", fingerprint_digest="d", init_scale=init_scale)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-mixed", torch.bfloat16), ("fp16-mixed", torch.float16)])
def test_autocast_switches_on_the_precision(precision: str, dtype: torch.dtype) -> None:
    with _config(precision).autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == dtype
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == dtype
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_is_a_no_op_for_fp32() -> None:
    with _config("fp32").autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_grad_scaler_only_for_fp16_with_the_chosen_scale() -> None:
    assert not _config("bf16-mixed").grad_scaler().is_enabled()
    scaler = _config("fp16-mixed", init_scale=1024.0).grad_scaler()
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    assert _config("fp16-mixed").grad_scaler().get_scale() == 65536.0


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize(("memory_format", "optimizer"), [("contiguous", "default"), ("channels_last", "fused")])
def test_a_training_step_with_the_whole_config_applied(precision: str, memory_format: str, optimizer: str) -> None:
    # GradScaler's default first scale (65536) can overflow a fresh model's fp16 gradients, and the step is then
    # skipped by design (what a calibration's measured init_scale avoids): a scale of 1024 keeps this one step's.
    scale = 1024.0 if precision == "fp16-mixed" else None
    config = Config.model_validate({**_config(precision, scale).model_dump(), "memory_format": memory_format,
                                    "optimizer": optimizer})
    # Two images: the cnn's fp16 backward is emulated on CPUs without fp16 convolution kernels (11 s at its batch
    # of 32 here); the Config's settings, not the batch, are under test.
    torch.manual_seed(0)
    workload = autotune.get_family("cnn").build(batch_size=2)
    model, optimizer_ = config.prepare(workload.model)
    scaler = config.grad_scaler()
    before = [p.detach().clone() for p in model.parameters()]
    images, labels = config.prepare_batch(workload.inputs)
    with config.autocast():
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer_.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer_)
    scaler.update()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_config_is_frozen_and_json_round_trips() -> None:
    config = _config("bf16-mixed")
    with pytest.raises(ValueError):
        config.device = "cuda:0"  # type: ignore[misc]
    assert Config.model_validate_json(config.model_dump_json()) == config


def test_a_decided_config_dumps_every_key_it_always_had() -> None:
    """Config is built from the pick's candidate: the dump (CLI --json, an app's logs) keeps its keys and values."""
    from samples import family, timed

    from autotune._config import config_of
    from autotune._decide import decide
    from autotune._records import Candidate

    fast = timed("cpu", "bf16-mixed", 50.0, init_scale=None)
    fast = fast.model_copy(update={"candidate": Candidate(device="cpu", precision="bf16-mixed",
                                                          memory_format="channels_last", optimizer="fused"),
                                   "peak_bytes": 3 * 2**20})
    config = config_of(decide(family("cnn", timed("cpu", "fp32", 100.0), fast), digest="d"))
    dumped = config.model_dump()
    assert dumped == {
        "model_kind": "cnn", "device": "cpu", "precision": "bf16-mixed", "source": "measured",
        "reason": config.reason, "step_ms": fast.timing.mean_ms if fast.timing else None, "setup_s": 0.1,
        "speedup_vs_fp32_cpu": dumped["speedup_vs_fp32_cpu"], "init_scale": None, "peak_memory_mb": 3.0,
        "num_threads": None, "memory_format": "channels_last", "optimizer": "fused", "compiled": False,
        "noisy": False, "fingerprint_digest": "d", "measured_at": "2026-11-30T00:00:00+00:00",
        "evidence": dumped["evidence"],  # added, the decision's evidence
        "ranks": None,  # added: the job of many processes it was agreed for
    }
    assert config.evidence is not None and dumped["evidence"] == config.evidence.model_dump()
    assert 1.9 < dumped["speedup_vs_fp32_cpu"] < 2.1
    assert config.candidate == fast.candidate and config.variants == ["channels_last", "fused-optimizer"]
    assert Config.model_validate_json(config.model_dump_json()) == config


def test_repr_is_the_answer_not_its_evidence(tiny_family: str) -> None:
    """The evidence (every rival: thousands of characters) stays out of repr(); model_dump() and cfg.evidence
    have it."""
    from samples import family, timed

    from autotune._cache import lookup

    times = {"fp32": 100.0, "bf16-mixed": 40.0, "fp16-mixed": 90.0}
    lookup.store().save(autotune.fingerprint(), family(tiny_family, *(timed("cpu", p, ms) for p, ms in times.items())))
    config = autotune.best_config(tiny_family)
    assert config.evidence is not None and len(config.evidence.rivals) == 2
    shown = repr(config)
    assert len(shown) < 700 and "evidence" not in shown and "reason='bf16 mixed precision" in shown
    assert config.model_dump()["evidence"]["rivals"]


@pytest.mark.parametrize(("device", "benchmark"), [("cpu", False), ("cuda:0", torch.version.hip is None)],
                         ids=["cpu", "cuda"])
def test_a_cuda_config_runs_convolutions_as_calibration_timed_them(
        device: str, benchmark: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # cuDNN's benchmark mode: on for every NVIDIA CUDA candidate's steps, and so for its Config (not on ROCm,
    # where it makes MIOpen search exhaustively). The flag is process state: put back after the test.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    config = Config(model_kind="cnn", device=device, precision="fp32", source="measured", reason="test",
                    fingerprint_digest="d")
    with _fp32.preserved():
        config.apply_precision()
    assert torch.backends.cudnn.benchmark is benchmark
