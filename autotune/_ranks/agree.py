"""The job's answer on each rank, as pure functions of measurements and Configs (no process group here).

- A rank answers from its own view of its machine's measurements (:func:`view`): the CPU, MPS, and of each kind
  of device with an index only its own (``cuda:LOCAL_RANK``, :func:`own_device`).
- The deciding rank's answer is the job's choice (:func:`for_rank`): what DDP needs identical on every rank (the
  kind of device, precision, memory format, optimizer kernels, compilation, GradScaler's init_scale) comes from
  it; the device index and the CPU thread count are each rank's own. A machine whose own pick differs takes the
  choice anyway, and its reason says what its own measurements say the choice costs there.
- :func:`digest` is what every rank compares before training: a mismatch is an error naming both answers.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence

from autotune._decision import Decision
from autotune._ranks.launch import own_index
from autotune._records import (
    FP32_CPU,
    Agreement,
    CandidateResult,
    Choice,
    Drop,
    Evidence,
    FamilyResult,
    Ranks,
)
from autotune._variants import AXES, CPU, NUM_THREADS, SHARED_FIELDS, precision_row
from autotune._wording import agreed_reason
from autotune.backends import Accelerator


def device_counts(accelerators: Sequence[Accelerator]) -> dict[str, int]:
    """How many devices of each kind a machine shows, e.g. ``{"cuda": 2}``: its fingerprint's accelerators."""
    return dict(Counter(a.backend for a in accelerators))


def own_device(device: str, local_rank: int, counts: dict[str, int]) -> str:
    """``device``'s kind on the rank's own device: ``'cuda:0'`` -> ``'cuda:1'`` for local rank 1 of a machine with
    two; ``'cpu'`` and ``'mps'`` as they are."""
    kind, _, index = device.partition(":")
    if not index:
        return device
    return f"{kind}:{own_index(local_rank, counts.get(kind, 1))}"


def view(measured: FamilyResult, local_rank: int, counts: dict[str, int]) -> FamilyResult:
    """``measured`` as local rank ``local_rank`` answers from it: without the devices of other ranks. Evidence
    against another rank's device (the CPU outpaced by ``cuda:1``) holds against the rank's own one of that kind,
    the same model as torchrun's ranks of one machine use."""

    def own(drop: Drop | None) -> Drop | None:
        if drop is None:
            return None
        return drop.model_copy(update={"by": drop.by.model_copy(
            update={"device": own_device(drop.by.device, local_rank, counts)})})

    kept = [r.model_copy(update={"timing": r.timing.model_copy(update={
                "dropped": own(r.timing.dropped), "outpaced": own(r.timing.outpaced)})}) if r.timing else r
            for r in measured.candidates if own_device(r.candidate.device, local_rank, counts) == r.candidate.device]
    return measured.model_copy(update={"candidates": kept})


def shared(config: Decision) -> dict[str, object]:
    """What DDP needs identical on every rank, e.g. ``{"device": "cuda", "precision": "bf16-mixed", ...}``."""
    return {"device": config.device_type, **{name: getattr(config, name) for name in SHARED_FIELDS},
            "init_scale": config.init_scale if precision_row(config.precision).grad_scaler else None}


def digest(config: Decision) -> str:
    """16 hex digits over :func:`shared`: equal on every rank of a job that trains one configuration."""
    canonical = json.dumps(shared(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def words(config: Decision) -> str:
    """:func:`shared` for an error message, e.g. ``'cuda bf16-mixed channels_last'``, ``'cpu fp16-mixed init_scale
    1024'``."""
    choice = Choice(device=config.device_type, precision=config.precision,
                    **{name: getattr(config, name) for name in SHARED_FIELDS if name != "precision"})
    scale = shared(config)["init_scale"]
    return f"{choice.device} {choice.precision}{choice.variant_words}" + (f" init_scale {scale:g}" if scale else "")


def _here(choice: Decision, device: str, measured: FamilyResult | None) -> CandidateResult | None:
    """The fastest of this machine's measurements of ``choice`` on ``device``, whatever its thread count."""
    if measured is None:
        return None
    found = [r for r in measured.candidates if r.usable and r.timing is not None and r.candidate.device == device
             and all(getattr(r.candidate, name) == getattr(choice, name) for name in SHARED_FIELDS)]
    return min(found, key=lambda r: r.timing.median_ms if r.timing else float("inf"), default=None)


def _cost(choice: Decision, device: str, own: Decision, measured: FamilyResult | None
          ) -> tuple[float | None, CandidateResult | None]:
    """What this machine's measurements say ``choice`` on ``device`` costs: its step time over ``own``'s, and the
    result it timed. Where the search here did not try the choice's variants, the two precisions' plain
    candidates (each without variants) stand in for them."""
    if measured is None:
        return None, None
    here, against = _here(choice, device, measured), measured.result(own.candidate)
    if here is None:
        here = measured.result(choice.candidate.base.model_copy(update={"device": device}))
        against = measured.result(own.candidate.base)
    if here is None or here.timing is None or not here.usable or against is None or against.timing is None:
        return None, None
    return here.timing.median_ms / against.timing.median_ms, here


def _threads(result: CandidateResult | None, share: int) -> int:
    """A CPU answer's thread count in a job: as measured (the candidate's own count, else the count it ran
    with), else each process's share of the cores."""
    if result is None:
        return share
    return result.candidate.num_threads or result.num_threads or share


def for_rank(choice: Decision, own: Decision, measured: FamilyResult | None, *, ranks: Ranks, decided_by: int,
             counts: dict[str, int], share: int) -> Decision:
    """This rank's answer in the job: ``choice`` (the deciding rank's) on this rank's own device, where ``own`` is
    what this rank's view of its machine's ``measured`` answers by itself (None: nothing measured here).

    CPU answers carry their thread count (``share``, each process's share of the cores, where nothing here says
    better): the launcher's default in each process is not what was measured."""
    device = own_device(choice.device, ranks.local_rank, counts)
    agreement = Agreement(decided_by=decided_by)
    if digest(own) == digest(choice) and own.device == device:
        answer = own
        here = measured.result(own.candidate) if measured is not None else None
    else:
        here = _here(choice, device, measured)
        cost, timed = _cost(choice, device, own, measured)
        plain = timed is not None and timed is not here
        agreement = agreement.model_copy(update={
            "own": own.candidate, "cost": cost, "measured_as": timed.candidate if timed is not None else None})
        baseline = measured.result(FP32_CPU) if measured is not None else None
        updates: dict[str, object] = {
            "device": device, **{axis.field: axis.default for axis in AXES if not axis.shared},
            "fingerprint_digest": own.fingerprint_digest,
            "noisy": own.noisy, "measured_at": own.measured_at, "step_ms": None, "setup_s": None,
            "peak_memory_mb": None, "speedup_vs_fp32_cpu": None,
        }
        if here is not None and here.timing is not None:
            updates.update(step_ms=here.timing.median_ms, setup_s=here.setup_s,
                           peak_memory_mb=here.peak_bytes / 2**20 if here.peak_bytes is not None else None,
                           speedup_vs_fp32_cpu=(baseline.timing.median_ms / here.timing.median_ms
                                                if baseline is not None and baseline.timing else None))
        answer = choice.model_copy(update=updates)
        answer = answer.model_copy(update={"reason": agreed_reason(
            answer.candidate, own.candidate, cost, decided_by=decided_by, plain=plain)})
    threads = _threads(here, share) if device == CPU else NUM_THREADS.default
    evidence = (own.evidence or Evidence()).model_copy(update={"agreement": agreement})
    return answer.model_copy(update={NUM_THREADS.field: threads, "init_scale": choice.init_scale, "ranks": ranks,
                                     "evidence": evidence})


__all__ = ["device_counts", "digest", "for_rank", "own_device", "shared", "view", "words"]
