"""What to measure: device x precision for this machine, then variants of each device's best.

``plan`` asks the backends (in the worker); everything else here is pure, so the simulation harness drives
the same search with candidates taken from a truth profile.
"""

from __future__ import annotations

from collections.abc import Collection

from autotune._env import Search
from autotune._records import Candidate
from autotune._variants import Facts, fewer_threads
from autotune.backends import all_backends

BASELINE = Candidate(device="cpu", precision="fp32")


def plan() -> tuple[list[Candidate], dict[str, str]]:
    """Every device x precision worth measuring here, baseline first, and why other backends offer none."""
    candidates: list[Candidate] = []
    notes: dict[str, str] = {}
    for backend in all_backends():
        reason = backend.unusable_reason()
        if reason is not None:
            notes[backend.name] = reason
            continue
        for device in backend.devices():
            candidates += [Candidate(device=device, precision=p) for p in backend.precisions(device)]
    candidates.sort(key=lambda c: c != BASELINE)
    return candidates, notes


def variants(
    leader: Candidate, stage: int, facts: Facts, *, search: Search, default_threads: int,
    tried: Collection[Candidate],
) -> list[Candidate]:
    """Stage 2: layout and optimizer variants of a device's leader. Stage 3: combinations, and CPU threads.

    ``tried`` holds the candidates the previous stage timed: every other stage-2 variant combines with the new
    leader in stage 3, dropped or not. Stage 2 compares each variant with the stage leader, so a variant of a
    small gain (a fused optimizer) is dropped next to one of a large gain (channels_last), and its gain shows
    only in the combination.
    """
    found: list[Candidate] = []
    if stage == 2:
        if facts.image_inputs and leader.memory_format == "contiguous":
            found.append(leader.model_copy(update={"memory_format": "channels_last"}))
        if facts.default_optimizer and leader.optimizer == "default":
            found.append(leader.model_copy(update={"optimizer": "fused"}))
        if search == "extended" and not leader.compiled:
            found.append(leader.model_copy(update={"compiled": True}))
        return found
    for other in tried:
        if other.base == leader.base and other != leader and other.num_threads is None:
            combined = leader.model_copy(update={
                "memory_format": "channels_last" if "channels_last" in (leader.memory_format, other.memory_format)
                else "contiguous",
                "optimizer": other.optimizer if other.optimizer != "default" else leader.optimizer,
                "compiled": leader.compiled or other.compiled,
            })
            if combined not in tried and combined not in found:
                found.append(combined)
    if leader.device == "cpu":
        found += [leader.model_copy(update={"num_threads": count}) for count in fewer_threads(default_threads)]
    return found


__all__ = ["BASELINE", "plan", "variants"]
