"""How much memory one candidate's training steps hold at a given batch size, measured in the worker.

The probe for ``autotune.max_batch_size``: the family built at ``batch_size``, the candidate's real training
step (:class:`~autotune._lab.step.TrainStep`, the one calibration timed), a few steps, and the
backend's peak since a reset taken just before the build. Each probe starts from a clean slate: the previous
probe's objects are collected and the allocators' free memory handed back before the reset, so a probe
smaller than the one before still shows what it needs (on the CPU, glibc would otherwise keep the freed
pages resident and the new allocations would reuse them unseen), and each runs one unmeasured step at its
batch first (see ``probe_memory``).
"""

from __future__ import annotations

import gc
import sys

from autotune._lab.prepare import classify
from autotune._lab.protocol import MemoryProbed, MemoryProbeJob
from autotune._lab.step import TrainStep, start_device
from autotune.backends import Backend, _linux, backend_for


def pin_allocator() -> None:
    """In a worker that only probes memory: pin glibc's mmap threshold, so a peak is what the step's tensors
    need, the same from run to run (``_linux.pin_mmap_threshold``). Never in the app's own process: it changes
    the allocator for everything after it; in-process probes read the app's allocator as it is."""
    if sys.platform == "linux":
        _linux.pin_mmap_threshold()


def probe_memory(job: MemoryProbeJob) -> MemoryProbed:
    """Run the job's steps and report their peak; an exception in them becomes the probe's failure."""
    backend = backend_for(job.candidate.device)
    free_bytes: int | None = None
    try:
        start_device(backend, job.candidate.device)
        # One unmeasured step at this batch first, with everything it built freed again: one-time costs (the
        # thread pool's and oneDNN's first allocations, a device's context) are paid, and glibc's allocator is
        # in the state a training run reaches after its first step (it raises its mmap threshold to the
        # tensors freed), whichever probe ran before: without it the same batch peaked lower when it came first.
        _steps(job, backend, batch_size=job.batch_size, steps=1)
        _clean(backend, job.candidate.device)
        free_bytes = backend.free_memory_bytes(job.candidate.device)
        backend.reset_peak_memory(job.candidate.device)
        _steps(job, backend, batch_size=job.batch_size, steps=job.steps)
        peak = backend.peak_memory_bytes(job.candidate.device)
        reserved = backend.peak_reserved_bytes(job.candidate.device)
    except Exception as exc:
        failure = classify(exc, job.candidate.device)
        del exc  # its traceback holds the failed step's tensors
        _clean(backend, job.candidate.device)
        return MemoryProbed(batch_size=job.batch_size, peak_bytes=None, peak_reserved_bytes=None,
                            free_bytes=free_bytes, failure=failure)
    _clean(backend, job.candidate.device)
    return MemoryProbed(batch_size=job.batch_size, peak_bytes=peak, peak_reserved_bytes=reserved,
                        free_bytes=free_bytes)


def _steps(job: MemoryProbeJob, backend: Backend, *, batch_size: int, steps: int) -> None:
    step = TrainStep(job.family, job.candidate, backend, seed=0, fp32_host=job.fp32, init_scale=job.init_scale,
                     batch_size=batch_size)
    with step.selected():
        for _ in range(steps):
            step.run()


def _clean(backend: Backend, device: str) -> None:
    gc.collect()
    backend.release_cached_memory(device)


__all__ = ["probe_memory"]
