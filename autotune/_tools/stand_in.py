"""The training step's stand-in while a DataLoader is measured: the step time calibration recorded for a Config,
spent where the step spends it, without its model.

Each batch is copied to the Config's device as a fast loop copies it (from pinned memory, ``non_blocking``, where
copies are asynchronous), the copy waited for, then the step's time is spent: on the CPU as a fixed amount of matrix
products on the training's threads, sized to take the step time alone at the Config's thread count (with workers
beside it, or fewer threads, it takes what the training would: the cores are shared the same way); on an
accelerator as a busy host thread (the loop's own, launching kernels and waiting on them). Nothing is placed on the
device but the batch, freed at the next.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from autotune import _batch
from autotune._variants import CPU
from autotune.backends import Backend

#: the matrix products' side: about a tenth of a millisecond each on one core, fine enough for short steps
_SIDE = 96
#: the products timed to size the work, after as many to warm up
_SIZING_PRODUCTS = 64


class StandIn:
    """A step of ``step_ms`` (0: none) for ``device``; on the CPU sized at ``threads`` training threads."""

    def __init__(self, *, step_ms: float, device: str, backend: Backend, threads: int | None, pin: bool) -> None:
        self.step_ms = step_ms
        self.device = device
        self.backend = backend
        self.pin = pin
        self.on_cpu = backend.device_type == CPU
        self.products = 0
        if self.on_cpu and step_ms > 0:
            self._left = torch.rand(_SIDE, _SIDE, generator=torch.Generator().manual_seed(0))
            self._right, self._out = self._left.t().contiguous(), torch.empty(_SIDE, _SIDE)
            if threads is not None:
                torch.set_num_threads(threads)
            self.products = round(step_ms / self._product_ms())

    def copy(self, batch: Any) -> None:
        """Copy ``batch``'s tensors to the device and wait for them; the CPU's need none."""
        if self.on_cpu:
            return
        copied = _batch.map_tensors(batch, lambda t: t.to(self.device, non_blocking=self.pin))
        self.backend.synchronize(self.device)
        del copied

    def copy_ms(self, batch: Any) -> float:
        """ms to pin (where the loop pins) and copy ``batch``, the median of three: a loop without workers pays it
        in its own thread."""
        if self.on_cpu:
            return 0.0
        times = []
        for _ in range(3):
            started = time.perf_counter()
            self.copy(_batch.map_tensors(batch, torch.Tensor.pin_memory) if self.pin else batch)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def run(self) -> None:
        """Spend one step's time: the sized products on the CPU, a busy host thread elsewhere."""
        if self.on_cpu:
            for _ in range(self.products):
                torch.mm(self._left, self._right, out=self._out)
            return
        until = time.perf_counter() + self.step_ms / 1000
        while time.perf_counter() < until:
            pass

    def _product_ms(self) -> float:
        for _ in range(_SIZING_PRODUCTS):
            torch.mm(self._left, self._right, out=self._out)
        started = time.perf_counter()
        for _ in range(_SIZING_PRODUCTS):
            torch.mm(self._left, self._right, out=self._out)
        return (time.perf_counter() - started) * 1000 / _SIZING_PRODUCTS


__all__ = ["StandIn"]
