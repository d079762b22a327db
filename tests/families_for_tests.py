"""Families used by the tests: small healthy ones, and real failing workloads.

They live in an importable module because the calibration worker is a separate process that imports
``build()`` by name (the test directory is on the host's sys.path, which the worker inherits).
"""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autotune import Workload
from autotune._families import cross_entropy


def build_tiny() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return Workload(model, (torch.randn(16, 8), torch.randint(0, 4, (16,))), cross_entropy)


def build_not_a_workload() -> tuple[nn.Module, Tensor]:
    return nn.Linear(2, 2), torch.zeros(1, 2)


def _failing(loss_fn) -> Workload:  # type: ignore[no-untyped-def]
    base = build_tiny()
    return Workload(base.model, base.inputs, loss_fn)


def _abort(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    os.abort()  # what an MPS graph assertion does: SIGABRT, no Python exception


def _segfault(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    ctypes.string_at(0)
    raise AssertionError("unreachable")


def _exit(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    os._exit(3)  # a library that quits the process: no signal, no exception, an exit status


def _hang(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    time.sleep(3600)
    raise AssertionError("unreachable")


def _cpu_allocator_oom(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    torch.empty(2**45, dtype=torch.uint8)  # 32 TiB: the real CPU allocator refuses
    raise AssertionError("unreachable")


def _raise_oom(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def _value_error(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    raise ValueError("labels have 3 classes but the model predicts 4")


def _abort_under_bf16(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        os.abort()
    return cross_entropy(model, inputs)


def build_abort() -> Workload:
    return _failing(_abort)


def build_segfault() -> Workload:
    return _failing(_segfault)


def build_exit() -> Workload:
    return _failing(_exit)


def build_hang() -> Workload:
    return _failing(_hang)


def build_cpu_oom() -> Workload:
    return _failing(_cpu_allocator_oom)


def build_raise_oom() -> Workload:
    return _failing(_raise_oom)


def build_value_error() -> Workload:
    return _failing(_value_error)


def build_abort_under_bf16() -> Workload:
    return _failing(_abort_under_bf16)


def build_slow() -> Workload:
    """Healthy but slow to time: half a second per step, so a host can be killed mid-calibration."""

    def slow_loss(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
        time.sleep(0.5)
        return cross_entropy(model, inputs)

    return _failing(slow_loss)


def _steady(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    time.sleep(0.01)
    return cross_entropy(model, inputs)


def build_steady() -> Workload:
    """10 ms more per step whatever the candidate: every stage's timing lasts long enough for the OS to read."""
    return _failing(_steady)


# -- numerics ------------------------------------------------------------------------------------------------


def build_fp16_overflow() -> Workload:
    """Inputs around 1e5: beyond fp16's 65504, so fp16 autocast turns them into inf; fp32 and bf16 are fine."""
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 4))
    inputs = torch.randn(32, 16) * 1e5
    return Workload(model, (inputs, torch.randint(0, 4, (32,))), cross_entropy)


def _offset_regression(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    features, target = inputs
    return F.mse_loss(model(features).squeeze(-1), target)


def build_precision_sensitive_regression() -> Workload:
    """A wide regressor whose targets sit at 1000 +- 1: the signal lives below bf16's resolution at 1000
    (spacing 4 between representable values), so bf16 matmuls erase it while fp32 learns it.
    Wide enough that bf16 autocast is faster than fp32 on an AVX512-bf16 / AMX CPU."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1))
    with torch.no_grad():
        model[2].bias.fill_(1000.0)
    features = torch.randn(256, 512)
    target = 1000.0 + features[:, :4].sum(dim=1) * 0.25
    return Workload(model, (features, target), _offset_regression)


class _WrongBackwardUnderAutocast(torch.autograd.Function):
    """Identity forward; under autocast its backward flips and scales the gradient (a miscompiled kernel)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[no-untyped-def,override]
        ctx.broken = torch.is_autocast_enabled("cpu")
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[no-untyped-def,override]
        return -3.0 * grad if ctx.broken else grad


def _wrong_grad_loss(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    features, labels = inputs
    return F.cross_entropy(_WrongBackwardUnderAutocast.apply(model(features)), labels)


def build_wrong_grad_under_autocast() -> Workload:
    base = build_tiny()
    return Workload(base.model, base.inputs, _wrong_grad_loss)


def _sum_mse(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    features, target = inputs
    return F.mse_loss(model(features), target, reduction="sum")


def build_fp16_scale_overflow() -> Workload:
    """Sum-reduced MSE over a batch of 16: the largest gradient is ~25, which x 65536 overflows
    fp16 in backward and x 1024 does not. GradScaler's default start skips the first steps (halving its scale
    each time, as in BACKGROUND.md fact 5); starting at 1024 skips none."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    features = torch.randn(16, 16)
    target = torch.full((16, 8), 0.5)
    return Workload(model, (features, target), _sum_mse)


def build_tiny_cnn() -> Workload:
    """A small conv net: 4-D image inputs make the channels_last layout worth trying."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return Workload(model, (torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))), cross_entropy)


def sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.01)


def build_tiny_with_sgd() -> Workload:
    base = build_tiny()
    return Workload(base.model, base.inputs, base.loss, optimizer=sgd)


def _tensor_core_like_loss(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    # A tensor-core GPU in miniature: an fp32 step takes 10x as long as a mixed-precision one (A100: 19.5 vs
    # 312 TFLOPS), while the arithmetic stays the same tiny, correct model. The gap (45 ms) stays well above
    # what a busy 2-core machine adds to a step's compute and wake-up.
    time.sleep(0.005 if torch.is_autocast_enabled("cpu") else 0.05)
    return cross_entropy(model, inputs)


def build_tensor_core_like() -> Workload:
    return _failing(_tensor_core_like_loss)


# -- randomness and fp32 settings ------------------------------------------------------------------------------


class _OtherStreamDropout(nn.Module):
    """Dropout whose masks come from another random stream under autocast, as a GPU's generator's do against
    the CPU reference's from the same seed; with ``wrong_math`` it also scales its output under autocast."""

    def __init__(self, wrong_math: bool) -> None:
        super().__init__()
        self.wrong_math = wrong_math

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_autocast_enabled("cpu"):
            torch.rand(7)  # advances the stream: every later mask differs from the reference's
            if self.wrong_math:
                x = 1.5 * x
        return F.dropout(x, 0.5, self.training)


def _dropout_family(wrong_math: bool) -> Workload:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), _OtherStreamDropout(wrong_math), nn.Dropout(0.3),
                          nn.Linear(32, 4))
    return Workload(model, (torch.randn(32, 8), torch.randint(0, 4, (32,))), cross_entropy)


def build_dropout_other_stream() -> Workload:
    return _dropout_family(wrong_math=False)


def build_dropout_other_stream_wrong_math() -> Workload:
    return _dropout_family(wrong_math=True)


def _checks_fp32_settings(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    """Refuses to run unless the step's fp32 settings are what its precision means: IEEE for fp32, and the
    host's for mixed precision (the host test sets TF32 for CUDA through torch's per-backend API)."""
    matmul = torch.backends.cuda.matmul.fp32_precision
    conv = torch.backends.cudnn.conv.fp32_precision
    expected = ("tf32", "tf32") if torch.is_autocast_enabled("cpu") else ("ieee", "ieee")
    if (matmul, conv) != expected:
        raise RuntimeError(f"fp32 settings matmul={matmul} conv={conv}, expected {expected}")
    return cross_entropy(model, inputs)


def build_checks_fp32_settings() -> Workload:
    base = build_tiny()
    return Workload(base.model, base.inputs, _checks_fp32_settings)


def _abort_under_channels_last(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    if not inputs[0].is_contiguous():
        os.abort()  # a native crash that only the channels_last layout meets
    return cross_entropy(model, inputs)


def build_abort_under_channels_last() -> Workload:
    base = build_tiny_cnn()
    return Workload(base.model, base.inputs, _abort_under_channels_last)


_OOM_ONCE = {"raised": False}


def _cpu_oom_once_under_bf16(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    if torch.is_autocast_enabled("cpu") and not _OOM_ONCE["raised"]:
        _OOM_ONCE["raised"] = True  # per process: the first bf16 step of this worker runs out of memory
        torch.empty(2**45, dtype=torch.uint8)  # 32 TiB: the real CPU allocator refuses
    return cross_entropy(model, inputs)


def build_cpu_oom_once_under_bf16() -> Workload:
    base = build_tiny()
    return Workload(base.model, base.inputs, _cpu_oom_once_under_bf16)


#: models of the workspace-hungry families alive in this process; the precisions (or, for the every-build
#: family, the models) whose first step ran here
WORKSPACE_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()
WORKSPACE_CHOSEN: set[str] = set()
WORKSPACE_STEPPED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _take_workspace(first_steps: set[str] | weakref.WeakSet[nn.Module], key: str | nn.Module) -> None:
    """Like cuDNN's benchmark mode: a first step tries algorithms with large workspaces, which fit next to one
    other model of the family but not two (CUDA's error, raised on the CPU); later steps reuse the choice."""
    if key not in first_steps:
        if len(WORKSPACE_MODELS) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (algorithm workspace)")
        first_steps.add(key)  # type: ignore[arg-type]


def _workspace_hungry(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    # The choice is cached per precision in the process, as cuDNN caches it per layer configuration.
    _take_workspace(WORKSPACE_CHOSEN, str(torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu")
                    else "fp32")
    return cross_entropy(model, inputs)


def _workspace_hungry_every_build(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    _take_workspace(WORKSPACE_STEPPED, model)  # nothing cached between builds
    return cross_entropy(model, inputs)


def _workspace_family(loss_fn) -> Workload:  # type: ignore[no-untyped-def]
    base = build_tiny()
    WORKSPACE_MODELS.add(base.model)
    return Workload(base.model, base.inputs, loss_fn)


def build_workspace_hungry() -> Workload:
    return _workspace_family(_workspace_hungry)


def build_workspace_hungry_every_build() -> Workload:
    return _workspace_family(_workspace_hungry_every_build)


#: how many of the emulated-fp16 layers below ran in this process
FP16_LAYERS_RUN = {"count": 0}


class _EmulatedUnderFp16(nn.Module):
    """A layer whose kernel is emulated under fp16 autocast: 0.4 s per call, like fp16 convolutions on a CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
            FP16_LAYERS_RUN["count"] += 1
            time.sleep(0.4)
        return x


def build_emulated_fp16() -> Workload:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(8, 8), _EmulatedUnderFp16()]
    model = nn.Sequential(*layers, nn.Linear(8, 4))
    return Workload(model, (torch.randn(16, 8), torch.randint(0, 4, (16,))), cross_entropy)


#: the batch sizes the one-kernel emulated fp16 layer below ran at, in this process
FP16_KERNEL_BATCHES: list[int] = []


class _OneSlowKernelUnderFp16(nn.Module):
    """One kernel that cannot be interrupted, whose cost grows with the batch: 3 ms a sample, 100 ms under fp16
    autocast (emulated), like the backward of an fp16 convolution on a CPU without fp16 kernels."""

    def forward(self, x: Tensor) -> Tensor:
        fp16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
        if fp16:
            FP16_KERNEL_BATCHES.append(x.shape[0])
        time.sleep((0.1 if fp16 else 0.003) * x.shape[0])
        return x


def build_one_slow_fp16_kernel(batch_size: int = 32) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), _OneSlowKernelUnderFp16(), nn.Linear(8, 4))
    return Workload(model, (torch.randn(batch_size, 8), torch.randint(0, 4, (batch_size,))), cross_entropy)


class _UnsupportedUnderBf16(nn.Module):
    """A kernel with no bf16 implementation, raising as torch's do."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise NotImplementedError("\"slow_kernel_cpu\" not implemented for 'BFloat16'")
        return x


def build_one_slow_fp16_kernel_no_bf16(batch_size: int = 32) -> Workload:
    """The one-slow-kernel family with a layer bf16 cannot run (in its probe and in its steps alike)."""
    workload = build_one_slow_fp16_kernel(batch_size)
    return Workload(nn.Sequential(workload.model, _UnsupportedUnderBf16()), workload.inputs, workload.loss)


def build_one_slow_fp16_kernel_any_batch(**_: object) -> Workload:
    """The same, from a build that takes ``batch_size=`` (in ``**kwargs``) but always returns 32 samples."""
    return build_one_slow_fp16_kernel()


# -- batch sizes and memory (issue #15) ------------------------------------------------------------------------


class _TokenClassifier(nn.Module):
    """Per-token layers over 256 tokens of 128 features: about half a MiB of activations per sample, so
    peak memory grows clearly with the batch while the model itself stays small."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.layers(tokens).mean(dim=1)
        return out


def build_batched(batch_size: int = 8) -> Workload:
    torch.manual_seed(0)
    return Workload(_TokenClassifier(), (torch.randn(batch_size, 256, 128), torch.randint(0, 4, (batch_size,))),
                    cross_entropy)


#: the batch above which the failing families below stop a step
FAILS_ABOVE = 12  # above the first probe (4), under the second (16): the search backs off at once


def _oom_above(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    if inputs[0].shape[0] > FAILS_ABOVE:  # what a GPU allocator raises when the batch does not fit
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {inputs[0].shape[0]} MiB")
    return cross_entropy(model, inputs)


def _killed_above(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    if inputs[0].shape[0] > FAILS_ABOVE:  # what the kernel's OOM killer does to a process over its memory
        os.kill(os.getpid(), 9)
    return cross_entropy(model, inputs)


def build_oom_above(batch_size: int = 8) -> Workload:
    base = build_batched(batch_size)
    return Workload(base.model, base.inputs, _oom_above)


def build_killed_above(batch_size: int = 8) -> Workload:
    base = build_batched(batch_size)
    return Workload(base.model, base.inputs, _killed_above)


def _counted(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    """Each step leaves a line in ``$RANKS_TEST_STEPS/<pid>``: which processes ran the family's steps."""
    with open(os.path.join(os.environ["RANKS_TEST_STEPS"], str(os.getpid())), "a") as steps:
        steps.write("step\n")
    return cross_entropy(model, inputs)


def build_counted() -> Workload:
    return _failing(_counted)


def _slow_in(model: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    """20 ms more per step in what ``$RANKS_TEST_SLOW`` names: ``fp32`` (no autocast) or ``mixed`` (CPU autocast): a
    machine whose precisions compare the other way round from another's."""
    mixed = torch.is_autocast_enabled("cpu")
    if os.environ.get("RANKS_TEST_SLOW") == ("mixed" if mixed else "fp32"):
        time.sleep(0.02)  # 10x a step here: clear on a busy machine too
    return cross_entropy(model, inputs)


def build_slow_in() -> Workload:
    return _failing(_slow_in)


# -- batches as loaders hand them ------------------------------------------------------------------------------


def _text_model_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    loss: Tensor = model(**batch).loss  # a Hugging Face model computes it from batch["labels"]
    return loss


def build_bert_encoding(batch_size: int = 16) -> Workload:
    """A BERT classifier built from a config (2 layers, hidden 32, no weights) on the ``BatchEncoding`` a tokenizer
    hands, padded: input_ids, attention_mask and labels."""
    from transformers import BatchEncoding, BertConfig, BertForSequenceClassification  # seconds: only where used

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3)
    mask = torch.ones(batch_size, 12, dtype=torch.long)
    mask[: batch_size // 2, 9:] = 0
    encoding = BatchEncoding({"input_ids": torch.randint(0, 100, (batch_size, 12)), "attention_mask": mask,
                              "labels": torch.randint(0, 3, (batch_size,))})
    return Workload(BertForSequenceClassification(config), encoding, _text_model_loss)


class Images(NamedTuple):
    pixels: Tensor
    weights: Tensor


def _weighted_images_loss(model: nn.Module, batch: list[Any]) -> Tensor:
    images, labels = batch
    return (F.cross_entropy(model(images.pixels), labels, reduction="none") * images.weights).mean()


def build_nested_batch(batch_size: int = 16) -> Workload:
    """A small conv net on ``[Images(pixels, weights), labels]``: a list holding a named tuple and a tensor, with
    4-D images (channels_last is tried)."""
    torch.manual_seed(0)
    images = Images(torch.randn(batch_size, 3, 8, 8), torch.rand(batch_size))
    return Workload(build_tiny_cnn().model, [images, torch.randint(0, 4, (batch_size,))], _weighted_images_loss)


@dataclass
class TokenBatch:
    """A loader's batch as a dataclass: tensors beside a string and an int it hands on."""

    tokens: Tensor
    labels: Tensor
    split: str = "train"
    epoch: int | None = None


def _token_loss(model: nn.Module, batch: TokenBatch) -> Tensor:
    return F.cross_entropy(model(batch.tokens), batch.labels)


def build_dataclass_batch(batch_size: int = 16) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(8 * 6, 4))
    batch = TokenBatch(torch.randint(0, 50, (batch_size, 6)), torch.randint(0, 4, (batch_size,)), epoch=3)
    return Workload(model, batch, _token_loss)


def build_numpy_in_batch() -> Workload:
    """A batch that holds an array a custom collate_fn left unconverted: nothing calibration can move."""
    base = build_tiny()
    features, labels = base.inputs
    return Workload(base.model, {"features": features.numpy(), "labels": labels}, base.loss)
