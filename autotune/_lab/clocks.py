"""What a device's throttle reasons say about a candidate's rounds in the final comparison.

A GPU's clock alone says little: it averages over the last fraction of a second (another candidate's work,
idle time), idles down between rounds, and a heavy bf16 load holds it under a power cap for as long as that
candidate runs, which is its speed in a training loop too. What counts is a throttle reason (thermal, power
cap, hardware slowdown) in force while a candidate's steps ran, *and* those rounds running slower than its
others: a slowdown the CPU-side control cannot see, that the next calibration should not inherit.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune import _stats
from autotune._records import ClockEvent


def throttle_slowdown(round_ms: Sequence[float], events: Sequence[Sequence[ClockEvent]],
                      earlier_ms: Sequence[float], limit: float) -> tuple[float, list[ClockEvent]] | None:
    """How much slower a candidate's rounds ran while its device reported a throttle reason than its other
    rounds, and the reasons; None when none was reported or the rounds moved by no more than ``limit``.

    ``events``: the reasons after each round's sample, as ``round_ms`` (empty where the device was not read).
    Its other rounds are those of this comparison without a reason, or, with fewer than three of them (a
    reason in force all along, a power cap or a long thermal event), ``earlier_ms``: its rounds before it."""
    if not any(events):
        return None
    hit = [ms for ms, found in zip(round_ms, events, strict=True) if found]
    clear = [ms for ms, found in zip(round_ms, events, strict=True) if not found]
    reference = clear if len(clear) >= 3 else list(earlier_ms)
    if not reference:
        return None
    slowdown = _stats.median(hit) / _stats.median(reference) - 1
    if slowdown <= limit:
        return None
    return slowdown, sorted({event for found in events for event in found})


__all__ = ["throttle_slowdown"]
