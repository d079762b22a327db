"""Stopping a pathologically slow candidate early (fp16 convolutions on a CPU without fp16 kernels).

``deadline`` raises from inside a step once its limit has passed (between kernels: a native one cannot be
interrupted). Before the first full step of a new precision on the CPU, :class:`Probe` times two forward +
backward passes on 1/``SHARE`` of the batch (at least ``MIN_BATCH``) against the device's fastest first
candidate; a candidate over the first-step factor both times and, scaled to the batch, over the step's limit is
``too_slow``. Only on the CPU: an asynchronous device's host runs ahead of its kernels.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import torch

from autotune import _batch
from autotune._apply import fp32 as _fp32
from autotune._families import Family
from autotune._lab.step import TrainStep
from autotune._records import Candidate
from autotune.backends import Backend

log = logging.getLogger("autotune")

#: a probe's batch is this share of the family's (at least ``MIN_BATCH``)
SHARE = 8
MIN_BATCH = 2


class Overtime(Exception):
    """A step ran past its limit: raised from inside it (a module or gradient hook)."""


@contextlib.contextmanager
def deadline(limit_s: float) -> Iterator[None]:
    """Raise :class:`Overtime` at the first module call (forward) or module-output gradient (backward) once
    ``limit_s`` has passed. Native kernels cannot be interrupted; the checks run between them. On an
    asynchronous device the host runs ahead of the kernels, so there it mostly catches slow host-side work."""
    started = time.perf_counter()

    def check(*_: object) -> None:
        if time.perf_counter() - started > limit_s:
            raise Overtime()

    def on_output(module: torch.nn.Module, args: object, output: object) -> None:
        check()
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(check)

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(check),
               torch.nn.modules.module.register_module_forward_hook(on_output)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def probe_batch(inputs: object) -> int | None:
    """The batch a probe uses for a family whose full batch is ``inputs``; None: no probe (no first dimension
    all its tensors share, or under ``SHARE * MIN_BATCH`` samples, where two passes would cost about a step)."""
    size = _batch.size(inputs)
    return size // SHARE if size is not None and size >= SHARE * MIN_BATCH else None


class TooSlow(Exception):
    """The probe's verdict: the candidate is far too slow to take a full step (the message says why)."""


class Probe:
    """One family's probes: its probe batch, and each device's reference pass."""

    def __init__(self, family: Family, *, seed: int, fp32_host: _fp32.Fp32Settings, factor: float) -> None:
        self.family = family
        self.seed = seed
        self.fp32_host = fp32_host
        self.factor = factor
        #: None until the first step is built, or for good once the family cannot be probed
        self.batch: int | None = None
        self.full_batch = 0
        self._sized = False
        #: device -> (the reference pass's seconds, its candidate)
        self.reference: dict[str, tuple[float, Candidate]] = {}
        #: probed once: a candidate built again (a later stage, a lower GradScaler scale) is not probed again
        self.probed: set[Candidate] = set()

    def size(self, inputs: object) -> None:
        """Learn the probe batch from the family's first built step (its full batch)."""
        if not self._sized:
            self._sized = True
            self.batch = probe_batch(inputs) if self.family.accepts_batch_size() else None
            self.full_batch = _batch.size(inputs) or 0

    def check(self, candidate: Candidate, backend: Backend, reference: Candidate, step_limit_s: float) -> float:
        """Probe ``candidate`` against the device's reference pass (timed with ``reference``, the device's
        fastest first step, at the device's first probe); ``step_limit_s``: the limit of a full first step now.
        Raises :class:`TooSlow`; else returns the set-up its first pass took over (0.0 when not probed)."""
        if self.batch is None or candidate in self.probed:
            return 0.0
        self.probed.add(candidate)
        if candidate.device not in self.reference:
            try:
                step = self._build(reference, backend)
                self.reference[candidate.device] = (min(self._pass(step, None) for _ in range(2)), reference)
            except Exception as exc:  # the family cannot be probed: full steps decide, as without a probe
                log.debug("%s: no probes (%s: %s)", self.family.name, type(exc).__name__, exc)
                self.batch = None
                return 0.0
        reference_s, reference = self.reference[candidate.device]
        scale = self.full_batch / self.batch
        # A pass the deadline stops is over both limits: the factor's, and the full step's scaled down.
        limit_s = max(self.factor * reference_s, step_limit_s / scale)
        try:
            step = self._build(candidate, backend)
            passes = [self._pass(step, limit_s) for _ in range(2)]
        except Exception as exc:  # only a shortcut: the full step runs next, and classifies what it raises
            log.debug("%s: probe of %s skipped (%s: %s)", self.family.name, candidate.label, type(exc).__name__, exc)
            return 0.0
        if all(pass_s > limit_s for pass_s in passes):
            raise TooSlow(
                f"a forward and backward pass on {self.batch} of {self.full_batch} samples took over "
                f"{1000 * min(passes):.0f} ms twice, {min(passes) / reference_s:.0f}x {reference.label}'s "
                f"({1000 * reference_s:.1f} ms; the limit: {1000 * limit_s:.0f} ms, {self.factor:.0f}x it and "
                f"{1000 * step_limit_s:.0f} ms for the full step); stopped before a full step")
        return max(0.0, passes[0] - passes[1])

    def _build(self, candidate: Candidate, backend: Backend) -> TrainStep:
        step = TrainStep(self.family, candidate, backend, seed=self.seed, fp32_host=self.fp32_host,
                         batch_size=self.batch)
        if _batch.size(step.inputs) != self.batch:  # every tensor of the batch at the probe's size
            raise ValueError(f"{self.family.name}'s build ignored batch_size={self.batch}")
        return step

    @staticmethod
    def _pass(step: TrainStep, limit_s: float | None) -> float:
        """Seconds of one forward + backward pass (until it was stopped, past ``limit_s``)."""
        with step.selected(), deadline(limit_s) if limit_s is not None else contextlib.nullcontext():
            started = time.perf_counter()
            try:
                step.forward_backward()
            except Overtime:
                pass
            return time.perf_counter() - started


__all__ = ["Overtime", "Probe", "TooSlow", "deadline", "probe_batch"]
