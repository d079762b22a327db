"""What ``Config.prepare`` / ``prepare_batch`` hand the app: optimizer keywords it takes, safe batch copies."""

from __future__ import annotations

import logging

import pytest
import torch

from autotune import Config
from autotune._apply.axes import copies_non_blocking


def _config(optimizer: str = "fused", device: str = "cpu") -> Config:
    return Config.model_validate({"model_kind": "tiny", "device": device, "precision": "fp32", "source": "measured",
                                  "reason": "test", "fingerprint_digest": "d", "optimizer": optimizer})


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train_one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, torch.optim.AdamW, torch.optim.Adam],
                         ids=["SGD", "AdamW", "Adam"])
def test_optimizers_that_take_fused_get_it(optimizer_class: type[torch.optim.Optimizer]) -> None:
    model, optimizer = _config("fused").prepare(_model(), optimizer_class, lr=0.01)
    assert optimizer.defaults["fused"] is True
    _train_one_step(model, optimizer)


@pytest.mark.parametrize("optimizer_class", [torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam],
                         ids=["RMSprop", "Adamax", "NAdam"])
def test_optimizers_without_fused_are_built_plain_and_the_log_says_so(
    optimizer_class: type[torch.optim.Optimizer], caplog: pytest.LogCaptureFixture
) -> None:
    # These used to raise TypeError: unexpected keyword argument 'fused'.
    with caplog.at_level(logging.WARNING, logger="autotune"):
        model, optimizer = _config("fused").prepare(_model(), optimizer_class, lr=0.01)
    assert "fused" not in optimizer.defaults or not optimizer.defaults["fused"]
    assert f"{optimizer_class.__name__} takes no fused= keyword" in caplog.text
    _train_one_step(model, optimizer)


def test_rmsprop_gets_the_foreach_variant_it_takes() -> None:
    _, optimizer = _config("foreach").prepare(_model(), torch.optim.RMSprop, lr=0.01)
    assert optimizer.defaults["foreach"] is True


@pytest.mark.parametrize("users", [{"fused": False}, {"fused": True}, {"foreach": True}],
                         ids=["fused=False", "fused=True", "foreach=True"])
def test_the_users_own_implementation_keyword_wins(users: dict[str, bool], caplog: pytest.LogCaptureFixture) -> None:
    # Used to raise TypeError: got multiple values for keyword argument 'fused'.
    with caplog.at_level(logging.INFO, logger="autotune"):
        model, optimizer = _config("fused").prepare(_model(), torch.optim.AdamW, lr=0.01, **users)
    for keyword, value in users.items():
        assert optimizer.defaults[keyword] is value
    assert "the caller's" in caplog.text and "wins over the measured fused implementation" in caplog.text
    _train_one_step(model, optimizer)


def test_a_factory_without_the_keyword_in_its_signature_gets_none() -> None:
    def factory(params, **options):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(params, lr=0.1, **options)

    _, optimizer = _config("fused").prepare(_model(), factory)
    assert not optimizer.defaults.get("fused")
    assert _config("fused").optimizer_kwargs() == {"fused": True}
    assert _config("fused").optimizer_kwargs(torch.optim.RMSprop) == {}
    assert _config("default").optimizer_kwargs() == {}


CPU, CUDA, XPU, MPS = (torch.device(t) for t in ("cpu", "cuda:0", "xpu:0", "mps"))


@pytest.mark.parametrize(
    ("source", "target", "pinned", "non_blocking"),
    [
        (CPU, CUDA, True, True),
        (CPU, XPU, True, True),
        (CPU, CUDA, False, False),  # pageable: staged and synchronous anyway
        (CPU, XPU, False, False),
        (CPU, MPS, True, False),  # pytorch/pytorch#189690, #139550: silent corruption when the source is freed
        (CPU, MPS, False, False),
        (CPU, CPU, False, False),
        (CUDA, CUDA, False, False),
        (CUDA, CPU, False, False),
        (MPS, CPU, False, False),
    ],
    ids=lambda v: str(v),
)
def test_batches_copy_non_blocking_only_from_pinned_memory_to_cuda_or_xpu(
    source: torch.device, target: torch.device, pinned: bool, non_blocking: bool
) -> None:
    assert copies_non_blocking(source, target, pinned=pinned) is non_blocking


def test_prepare_batch_on_the_cpu_copies_blocking_and_keeps_values() -> None:
    batch = (torch.randn(2, 3, 4, 4), torch.arange(2))
    images, labels = _config().prepare_batch(batch)
    assert torch.equal(images, batch[0]) and torch.equal(labels, batch[1])


def test_prepare_batch_moves_a_batch_encoding_and_keeps_its_type() -> None:
    from transformers import BatchEncoding

    encoding = BatchEncoding({"pixel_values": torch.randn(2, 3, 4, 4), "labels": torch.arange(2)})
    moved = _config().model_copy(update={"memory_format": "channels_last"}).prepare_batch(encoding)
    assert type(moved) is BatchEncoding and moved is not encoding
    assert moved.pixel_values.is_contiguous(memory_format=torch.channels_last)
    assert encoding["pixel_values"].is_contiguous()  # the loader's batch is left as it was
    assert torch.equal(moved["labels"], encoding["labels"])


def test_prepare_batch_keeps_nested_lists_named_tuples_and_dataclasses() -> None:
    from families_for_tests import Images, TokenBatch

    config = _config().model_copy(update={"memory_format": "channels_last"})
    nested = config.prepare_batch([Images(torch.randn(2, 3, 4, 4), torch.rand(2)), torch.arange(2)])
    assert type(nested) is list and type(nested[0]) is Images
    assert nested[0].pixels.is_contiguous(memory_format=torch.channels_last)
    batch = TokenBatch(torch.arange(12).view(2, 6), torch.arange(2), split="valid")
    moved = config.prepare_batch(batch)
    assert type(moved) is TokenBatch and moved is not batch
    assert torch.equal(moved.tokens, batch.tokens) and moved.split is batch.split and moved.epoch is None
