"""The largest batch that fits: ``autotune.max_batch_size("cnn", memory_limit_mb=4096)``.

The entry points run their probes in the calibration worker; the search (two probes, a fitted line,
confirmation with real steps) is :func:`find_max_batch`. Answers are cached per machine, family, candidate,
limit and margin (``autotune._cache.batch_answers``).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from collections.abc import Callable
from typing import Literal

import torch

from autotune._answer import answer
from autotune._apply import fp32 as _fp32
from autotune._cache.batch_answers import Answers
from autotune._calibrate import new_worker
from autotune._errors import BatchSizeUnsupportedError, ConfigurationError, MaxBatchError
from autotune._families import get_family
from autotune._fingerprint import fingerprint
from autotune._lab.protocol import MemoryProbed, MemoryProbeJob
from autotune._records import PRECISIONS, Candidate, Precision
from autotune._reports import MaxBatchReport, MemoryLine, MemoryProbe
from autotune._wording import mib_words

log = logging.getLogger("autotune")


# -- the public entry points -------------------------------------------------------------------------------


def _validate(margin: float, memory_limit_mb: float | None, precision: str | None, device: str | None) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ConfigurationError("margin", margin, "a share of the limit kept free, 0 <= margin < 1 (e.g. 0.15)")
    if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool)
                                        or not isinstance(memory_limit_mb, (int, float)) or not memory_limit_mb > 0):
        raise ConfigurationError("memory_limit_mb", memory_limit_mb, "a positive number of MiB, or None")
    if precision is not None and precision not in PRECISIONS:
        raise ConfigurationError("precision", precision, " | ".join(PRECISIONS))
    if device is not None:
        try:
            torch.device(device)
        except RuntimeError as exc:
            raise ConfigurationError("device", device, "a torch device: cpu, cuda, cuda:1, mps, xpu") from exc


def max_batch_report(
    model_kind: str, *, device: str | None = None, precision: Precision | None = None, margin: float = 0.15,
    memory_limit_mb: float | None = None, force: bool = False,
) -> MaxBatchReport:
    """The largest batch of ``model_kind`` that fits, with the probes and the fitted line behind it.

    See :func:`max_batch_size`; ``force=True`` measures again instead of answering from the cache.
    """
    _validate(margin, memory_limit_mb, precision, device)
    family = get_family(model_kind)
    if not family.accepts_batch_size():
        raise BatchSizeUnsupportedError(family.name, family.ref)
    init_scale = None
    if device is None or precision is None:
        config = answer(family)
        chosen = (device or config.device, precision or config.precision)
        if chosen == (config.device, config.precision):
            candidate, init_scale = config.candidate, config.init_scale
        else:
            candidate = Candidate(device=chosen[0], precision=chosen[1])
    else:
        candidate = Candidate(device=str(torch.device(device)), precision=precision)
    limit_bytes = int(memory_limit_mb * 2**20) if memory_limit_mb is not None else None
    cache = Answers(fingerprint().digest)
    key = "|".join([family.name, family.ref, family.version or "", candidate.label, f"{init_scale}", f"{margin:g}",
                    f"{limit_bytes}"])
    if not force:
        cached = cache.get(key)
        if cached is not None:
            return cached
    def probe(batch_size: int) -> MemoryProbed:
        job = MemoryProbeJob(family=family, candidate=candidate,
                             init_scale=init_scale, batch_size=batch_size, fp32=_fp32.current(),
                             sys_path=[p for p in sys.path if p])
        return worker.run_memory_probe(job)

    log.info("measuring the largest batch of %s on %s", model_kind, candidate.label)
    with new_worker() as worker:
        report = find_max_batch(probe, model_kind=model_kind, candidate=candidate, margin=margin,
                                memory_limit_bytes=limit_bytes)
    log.info("%s on %s: batch %d fits (peak %s of %s)", model_kind, candidate.label, report.batch_size,
             mib_words(report.peak_bytes), mib_words(report.target_bytes))
    cache.put(key, report)
    return report


def max_batch_size(
    model_kind: str, *, device: str | None = None, precision: Precision | None = None, margin: float = 0.15,
    memory_limit_mb: float | None = None,
) -> int:
    """The largest batch of ``model_kind`` whose training steps fit, e.g. ``max_batch_size("cnn") -> 412``.

    ``device`` and ``precision`` default to ``best_config(model_kind)``'s (calibrating on a miss); the family's
    ``build`` must take a ``batch_size`` keyword (the built-ins do; see ``register_family``). The limit is
    ``memory_limit_mb`` or the device's free memory (CUDA ``mem_get_info``, Metal's recommended working set,
    the CPU's available RAM), whichever is lower, less ``margin`` of it. It counts what training adds to the
    process that runs it: model, gradients, optimizer state, activations and the batch (on the CPU the rise
    of the resident size, not the interpreter and torch themselves). The answer is confirmed with real steps
    in the calibration worker and cached per machine, family, device, precision, limit and margin.
    Raises MaxBatchError when not even a batch of 1 fits.
    """
    return max_batch_report(model_kind, device=device, precision=precision, margin=margin,
                            memory_limit_mb=memory_limit_mb).batch_size


# -- the search -----------------------------------------------------------------------------------------------

#: the first probe's batch (halved while it does not fit); the second is 4x (or what the first allows)
FIRST_PROBE = 4
#: the search's upper bound: a larger batch is rarely a training choice, and its probe costs a long step
MAX_BATCH_SIZE = 65536
#: probes in all, the two line probes included; the search stops earlier once a batch is within CLOSE
MAX_PROBES = 10
#: a confirmed batch whose peak is within this share of the target is close enough
CLOSE = 0.03
#: predictions aim this share under the target (doubled after each batch that did not fit): a probe's peak
#: repeats within a fraction of a percent in the probe worker (the CPU's: ``_lab.max_batch.pin_allocator``), but the
#: line bends a little with the batch (the allocator's rounding, the library's algorithm choices)
AIM = 0.015
#: below this difference between two peaks the line's slope is page noise
NOISE_BYTES = 2**20

Probe = Callable[[int], MemoryProbed]


def find_max_batch(probe: Probe, *, model_kind: str, candidate: Candidate, margin: float,
                   memory_limit_bytes: int | None) -> MaxBatchReport:
    """Search with ``probe`` (batch size -> one probe's measurement); raises MaxBatchError if nothing fits."""
    started = time.perf_counter()
    probes: list[MemoryProbe] = []
    measured: dict[int, int] = {}  # batch -> peak, for every probe that measured one (fitting or over)
    batch = FIRST_PROBE
    first = probe(batch)
    free = first.free_bytes
    limits = [b for b in (memory_limit_bytes, free) if b is not None]
    if not limits:
        raise MaxBatchError(model_kind, candidate.label, f"{candidate.device} reports no free memory here; "
                            "pass memory_limit_mb")
    limit = min(limits)
    limit_from: Literal["memory_limit_mb", "free memory"] = (
        "memory_limit_mb" if memory_limit_bytes is not None and memory_limit_bytes <= limit else "free memory")
    target = int(limit * (1 - margin))

    def record(result: MemoryProbed) -> MemoryProbe:
        peak = _peak(result)
        if result.failure is not None and not _out_of_memory(result):
            raise MaxBatchError(model_kind, candidate.label, f"a step at batch {result.batch_size} failed "
                                f"({result.failure.kind}: {result.failure.detail})")
        if result.failure is None and peak is None:
            raise MaxBatchError(model_kind, candidate.label, f"{candidate.device} reports no peak memory on "
                                f"this system ({sys.platform})")
        if peak is None:
            outcome = MemoryProbe(batch_size=result.batch_size, peak_bytes=None, outcome="oom",
                                  detail=result.failure.detail if result.failure else None)
        else:
            measured[result.batch_size] = peak
            outcome = MemoryProbe(batch_size=result.batch_size, peak_bytes=peak,
                                  outcome="fits" if peak <= target else "over")
        probes.append(outcome)
        log.info("%s on %s: batch %d %s%s", model_kind, candidate.label, outcome.batch_size, outcome.outcome,
                 f", peak {peak / 2**20:.1f} MiB" if peak is not None else "")
        return outcome

    # 1. The smallest probe that fits, halving from FIRST_PROBE.
    result = first
    while record(result).outcome != "fits":
        if batch == 1:
            why = probes[-1].detail or f"a batch of 1 peaks at {mib_words(probes[-1].peak_bytes)}"
            raise MaxBatchError(model_kind, candidate.label, f"{why}, over the target of {mib_words(target)} "
                                f"({limit_from} {mib_words(limit)} less the {margin:.0%} margin)")
        batch //= 2
        result = probe(batch)
    good, bad = batch, None
    # 2. The second line probe: at most what the first peak, scaled in proportion, allows.
    second = min(4 * batch, int(target * batch / max(measured[batch], 1)), MAX_BATCH_SIZE)
    line, bad_oom = None, False  # bad_oom: the smallest failing batch ran out of memory (its peak is unknown)
    if second > batch:
        outcome = record(probe(second))
        if outcome.outcome == "fits":
            good = second
            line = _line(measured, batch, second)
        else:
            bad, bad_oom = second, outcome.outcome == "oom"
    # 3. Predict, confirm, refine: aim a little under the target, and lower after each batch that did not fit,
    # so the search settles on one that does. Below a batch that ran out of memory the line was wrong there:
    # halfway to it, not next to it (a probe that the kernel's OOM killer ends costs a worker start).
    overs = 0
    while len(probes) < MAX_PROBES and good < MAX_BATCH_SIZE and (bad is None or bad - good > 1):
        if measured[good] >= target * (1 - CLOSE):
            break
        aim = target * max(0.5, 1 - AIM * 2**overs)
        guess = min(_predict(measured, good, aim), MAX_BATCH_SIZE)
        if bad is not None:
            guess = min(guess, (good + bad) // 2 if bad_oom else bad - 1)
        if guess <= good:
            break
        outcome = record(probe(guess))
        if outcome.outcome == "fits":
            good, overs = guess, max(0, overs - 1)
        else:
            bad, bad_oom, overs = guess, outcome.outcome == "oom", overs + 1
    return MaxBatchReport(
        model_kind=model_kind, candidate=candidate, batch_size=good, peak_bytes=measured[good], limit_bytes=limit,
        limit_from=limit_from, free_bytes=free, margin=margin, target_bytes=target, line=line, probes=probes,
        capped=good >= MAX_BATCH_SIZE, measured_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        wall_s=time.perf_counter() - started,
    )


def _out_of_memory(result: MemoryProbed) -> bool:
    """An OOM the step raised, or a worker the kernel's OOM killer ended (SIGKILL: nothing else sends it)."""
    failure = result.failure
    return failure is not None and (failure.kind == "oom" or (failure.kind == "crashed"
                                                              and failure.detail.startswith("SIGKILL")))


def _peak(result: MemoryProbed) -> int | None:
    # Where a caching allocator reserves more than it hands out, the reserve is what the device gave.
    return result.peak_reserved_bytes if result.peak_reserved_bytes is not None else result.peak_bytes


def _line(measured: dict[int, int], low: int, high: int) -> MemoryLine:
    """The line through two measured batches; with page-noise between them, the proportional bound through
    the larger one (no fixed part: it overestimates every batch above it)."""
    rise = measured[high] - measured[low]
    if rise < NOISE_BYTES:
        return MemoryLine(fixed_bytes=0.0, per_sample_bytes=measured[high] / high, batches=(low, high))
    per_sample = rise / (high - low)
    return MemoryLine(fixed_bytes=measured[high] - per_sample * high, per_sample_bytes=per_sample,
                      batches=(low, high))


def _predict(measured: dict[int, int], good: int, target: float) -> int:
    """The largest batch the line through the measurements nearest above and below ``good`` keeps under
    ``target``: the local slope, where memory is least linear (algorithm choices change with the batch)."""
    ordered = sorted(measured)
    above = [b for b in ordered if b > good]
    below = [b for b in ordered if b < good]
    if above:
        low, high = good, above[0]
    elif below:
        low, high = below[-1], good
    else:
        low = high = good
    line = _line(measured, low, high) if low != high else MemoryLine(
        fixed_bytes=0.0, per_sample_bytes=measured[good] / good, batches=(good, good))
    if line.per_sample_bytes <= 0:  # nothing measured grows with the batch (a zero peak): grow step by step
        return 4 * good
    return int((target - line.fixed_bytes) / line.per_sample_bytes)


__all__ = [
    "MAX_BATCH_SIZE", "Probe", "find_max_batch", "max_batch_report", "max_batch_size",
]
