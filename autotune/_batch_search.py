"""The search for the largest batch that fits, given a probe (batch size -> one measured step's peak).

Memory of a training step is close to a line in the batch size: the model, its gradients and optimizer state
are fixed, activations and inputs grow with each sample. So: measure the peak at two small batches (real
steps in the calibration worker, :mod:`autotune._calibration.memory`), fit the line, take the largest batch
whose predicted peak stays under the target (the limit, or the device's free memory, times ``1 - margin``),
then confirm that batch with real steps. A confirmation that runs out of memory or peaks over the target
backs off (a refit through the measured points, or halfway to the last batch that fitted); one far under
the target refits and tries larger. The answer is always a batch whose measured peak stayed under the target.

No probe is sized to exceed the limit: the second probe is at most what the first one's peak scaled
proportionally allows (an upper bound, since the fixed part is never negative), and later ones are what the
line predicts fits. A line through two points a few pages apart says nothing (tiny models), so below
:data:`NOISE_BYTES` of difference the proportional bound stands in for it.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from autotune._errors import MaxBatchError
from autotune._models import Candidate
from autotune._reports import MaxBatchReport, MemoryLine, MemoryProbe

if TYPE_CHECKING:
    from autotune._calibration.protocol import MemoryProbed

log = logging.getLogger("autotune")

#: the first probe's batch (halved while it does not fit); the second is 4x (or what the first allows)
FIRST_PROBE = 4
#: the search's upper bound: a larger batch is rarely a training choice, and its probe costs a long step
MAX_BATCH_SIZE = 65536
#: probes in all, the two line probes included; the search stops earlier once a batch is within CLOSE
MAX_PROBES = 10
#: a confirmed batch whose peak is within this share of the target is close enough
CLOSE = 0.03
#: predictions aim this share under the target (doubled after each batch that did not fit): a probe's peak
#: repeats within a fraction of a percent in the probe worker (the CPU's: ``memory.pin_allocator``), but the
#: line bends a little with the batch (the allocator's rounding, the library's algorithm choices)
AIM = 0.015
#: below this difference between two peaks the line's slope is page noise
NOISE_BYTES = 2**20

Probe = Callable[[int], "MemoryProbed"]


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


def mib_words(value: float | None) -> str:
    return "an unknown amount" if value is None else f"{value / 2**20:.1f} MiB"


__all__ = ["MAX_BATCH_SIZE", "Probe", "find_max_batch", "mib_words"]
