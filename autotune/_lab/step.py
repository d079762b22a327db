"""One candidate's training step on its device: the unit every measurement and every check runs.

A step is what the user's loop does per batch: move the batch to the device, forward + loss under autocast,
backward (scaled for fp16), optimizer step, then synchronise so the time is the time the user waits for. The
batch is copied as a fast loop copies it (``pins_batches``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from autotune import _batch
from autotune._apply import axes
from autotune._apply import fp32 as _fp32
from autotune._apply import precision as _precision
from autotune._apply.precision import AUTOCAST_DTYPES, DEFAULT_INIT_SCALE
from autotune._families import Family
from autotune._records import Candidate
from autotune.backends import Backend


def start_device(backend: Backend, device: str) -> float:
    """Initialise ``device`` (CUDA context, allocator, library handles) outside any step; returns seconds."""
    started = time.perf_counter()
    torch.empty(1, device=device)
    backend.synchronize(device)
    return time.perf_counter() - started


def pins_batches(backend: Backend) -> bool:
    """Whether a step's batch is pinned once and copied ``non_blocking``, as a loop over a
    ``DataLoader(pin_memory=True)`` copies its batches: where copies from pinned memory are stream-ordered (CUDA,
    XPU), so the host launches the next step while the device still runs this one. From pageable memory every
    copy waits for the device's queued work, a synchronisation per step that no fast loop pays; on MPS a loop
    pays it too (non-blocking copies there lose data, pytorch/pytorch#189690)."""
    return backend.async_copies


class TrainStep:
    """Model, optimizer and GradScaler of one candidate, built from ``family`` with a fixed seed.

    Every step runs with the fp32 settings its precision means (``_fp32.target``; the host's for mixed
    precision), through forward, backward and optimizer alike, as ``Config.apply_precision`` applies them.
    """

    def __init__(
        self, family: Family, candidate: Candidate, backend: Backend, *, seed: int, fp32_host: _fp32.Fp32Settings,
        init_scale: float | None = None, batch_size: int | None = None,
    ) -> None:
        self.candidate = candidate
        self.fp32 = _fp32.target(candidate.precision, fp32_host)
        self.backend = backend
        self.asynchronous = backend.asynchronous
        self.device = torch.device(candidate.device)
        started = time.perf_counter()
        torch.manual_seed(seed)
        workload = family.build(batch_size)  # None: the family's own batch
        self.initial_params = [p.detach().clone() for p in workload.model.parameters()]
        start_device(backend, candidate.device)  # a no-op after the device's first candidate
        self.model = workload.model.to(self.device, **axes.model_keywords(candidate))
        self.model.train()
        #: the batch on the host, its tensors pinned where a loop's would be
        self.inputs = (_batch.map_tensors(workload.inputs, torch.Tensor.pin_memory) if pins_batches(backend)
                       else workload.inputs)
        self.loss_fn = workload.loss
        self.optimizer = axes.make_optimizer(workload, self.model, candidate)
        self.forward = axes.forward(candidate, self.model)
        #: what the workload says about which variants are worth trying
        self.facts = axes.facts(workload)
        scaled = AUTOCAST_DTYPES[candidate.precision] is torch.float16
        self.init_scale = (init_scale or DEFAULT_INIT_SCALE) if scaled else None
        self.scaler = _precision.grad_scaler(backend.device_type, candidate.precision, self.init_scale)
        self.build_s = time.perf_counter() - started

    def batch(self) -> Any:
        """The batch on the device, as each step copies it: as ``Config.prepare_batch`` does (an image batch in the
        candidate's memory format)."""
        return axes.move_batch(self.candidate, self.inputs)

    def _forward_backward(self, *, checked: bool = False) -> Tensor:
        inputs = self.batch()
        # Checked steps compare arithmetic with the CPU reference, whose random stream other devices lack.
        autocast = _precision.autocast(self.backend.device_type, self.candidate.precision)
        with autocast, (dropout_off() if checked else contextlib.nullcontext()):
            loss = self.loss_fn(self.forward, inputs)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        return loss

    def forward_backward(self) -> None:
        """Forward, loss and backward, synchronised, without the optimizer step: a probe's pass (inside
        ``selected()``)."""
        self._forward_backward()
        self.backend.synchronize(self.candidate.device)

    @contextlib.contextmanager
    def selected(self) -> Iterator[None]:
        """This candidate's process-wide settings for a block of steps, applied outside the timed region:
        the fp32 settings its precision means, its backend's loop settings (cuDNN's benchmark mode on NVIDIA
        CUDA, as ``Config.apply_precision`` sets it) and its variants' (its thread count)."""
        _fp32.ensure(self.fp32)
        self.backend.apply_loop_settings()
        with axes.process(self.candidate):
            yield

    def run(self, steps: int = 1, *, synchronize: bool = True) -> None:
        """``steps`` training steps, synchronised after the last unless ``synchronize=False`` (a loop's steps,
        which overlap the host's next work as the user's do) (inside ``selected()``)."""
        for _ in range(steps):
            self._step()
        if synchronize:
            self.backend.synchronize(self.candidate.device)

    def span(self, steps: int) -> list[float]:
        """The seconds of ``steps`` training steps as a loop runs them (inside ``selected()``): each between
        markers at the ends of the step before it and of its own, on the device's own clock
        (``Backend.step_clock``), while the host launches the next one. An untimed step goes first: it takes the
        host's lead, the queue's fill and a cold start after another candidate's (clocks, caches); the drain
        before the closing synchronisation is after the last marker. A loop that never synchronises pays none
        of them.

        A device without such a clock gives one figure from the host's: after an untimed step, a span of
        ``steps + 1`` less a lone step, whose lead, fill and drain cancel."""
        clock = self.backend.step_clock(self.candidate.device)
        if clock is None:
            self.run()
            started = time.perf_counter()
            self.run()
            one = time.perf_counter() - started
            started = time.perf_counter()
            self.run(steps + 1)
            span = time.perf_counter() - started
            return [(span - one) / steps if span > one else span / (steps + 1)]
        self._step()
        clock.mark()
        for _ in range(steps):
            self._step()
            clock.mark()
        self.backend.synchronize(self.candidate.device)
        return clock.intervals_s()

    def _step(self) -> None:
        self._forward_backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def run_checked(self) -> tuple[float, float, bool]:
        """One training step that also reports (loss, gradient norm, whether GradScaler skipped it); no dropout.

        Inside ``selected()``, like ``run``.
        """
        loss = self._forward_backward(checked=True)
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.backend.synchronize(self.candidate.device)
        # GradScaler has no "skipped" flag (pytorch/pytorch#67590): it halves the scale at every skip.
        skipped = scale_before is not None and self.scaler.get_scale() < scale_before
        return float(loss.detach().float()), grad_norm, skipped

    def update(self) -> Tensor:
        """All parameters' change since the seed, flattened on the CPU."""
        return torch.cat(
            [(p.detach().float().cpu() - p0.float()).flatten()
             for p, p0 in zip(self.model.parameters(), self.initial_params, strict=True)]
        )


_DROPOUTS: frozenset[Callable[..., Any]] = frozenset({
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
})
#: index of ``dropout_p`` in ``F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)``
_SDPA_DROPOUT_INDEX = 4


class _NoDropout(TorchFunctionMode):
    """Every dropout an identity, every attention dropout zero; everything else runs unchanged."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]  # what dropout does with training=False
        if func is F.scaled_dot_product_attention:
            if len(args) > _SDPA_DROPOUT_INDEX:
                args = (*args[:_SDPA_DROPOUT_INDEX], 0.0, *args[_SDPA_DROPOUT_INDEX + 1:])
            else:
                kwargs["dropout_p"] = 0.0
        elif func is F.multi_head_attention_forward:
            kwargs["training"] = False  # its only effect there is the attention dropout
        return func(*args, **kwargs)


@contextlib.contextmanager
def dropout_off() -> Iterator[None]:
    """Run the block with dropout switched off (see the module docstring)."""
    with _NoDropout():
        yield


__all__ = ["TrainStep", "dropout_off", "pins_batches", "start_device"]
