"""What to measure: device x precision for this machine, then variants of each device's best (the axes of
:mod:`autotune._variants`).

``plan`` asks the backends (in the worker); everything else here is pure, so the simulation harness drives
the same search with candidates taken from a truth profile.
"""

from __future__ import annotations

from collections.abc import Collection

from autotune import _variants
from autotune._records import Candidate
from autotune._variants import Facts, Search, Situation
from autotune.backends import all_backends

BASELINE = Candidate(device=_variants.CPU, precision=_variants.FP32.name)


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
    """Variants of a device's leader on each axis its stage proposes (stage 2: layout, optimizer kernels,
    compilation; stage 3: CPU threads); in stage 3 first the combinations of the stage-2 variants.

    ``tried`` holds the candidates the previous stage timed: every other stage-2 variant combines with the new
    leader in stage 3, dropped or not. Stage 2 compares each variant with the stage leader, so a variant of a
    small gain (a fused optimizer) is dropped next to one of a large gain (channels_last), and its gain shows
    only in the combination.
    """
    found: list[Candidate] = []
    if stage == 3:
        for other in tried:
            settings = _variants.changed(other)
            if other.base == leader.base and other != leader and all(axis.stage == 2 for axis, _ in settings):
                combined = leader.model_copy(update={axis.field: value for axis, value in settings})
                if combined not in tried and combined not in found:
                    found.append(combined)
    situation = Situation(facts=facts, device=leader.device, search=search, default_threads=default_threads)
    for axis in _variants.AXES:
        if axis.stage == stage and getattr(leader, axis.field) == axis.default:
            found += [leader.model_copy(update={axis.field: value}) for value in axis.propose(situation)]
    return found


__all__ = ["BASELINE", "plan", "variants"]
