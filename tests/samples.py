"""Hand-made measurement records of the CPU for decision-rule and store tests.

Other hardware enters the decision tests as truth profiles run through the real search (test_simulated.py,
test_machines.py), never as hand-made results.
"""

from __future__ import annotations

from pathlib import Path

from autotune._cache.freshness import family_key, rules_digest
from autotune._cache.store import Store
from autotune._config import Config
from autotune._families import family_names, get_family
from autotune._fingerprint import fingerprint
from autotune._records import Candidate, CandidateResult, Failure, FamilyResult, Numerics, Rival, Timing

# Each candidate's rounds start at their own place in this cycle, so two candidates never share their noise (as
# real interleaved rounds do not), and a series does not depend on which tests built series before it.
_NOISE = (1.0, 1.01, 0.99, 1.005, 0.995, 1.0, 1.008, 0.997)
_PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")


def timed(device: str, precision: str, step_ms: float, *, rounds: int = 6, setup_s: float = 0.1,
          jitter: float = 1.0, init_scale: float | None = None) -> CandidateResult:
    phase = _PRECISIONS.index(precision) + 4 * (device != "cpu")
    round_ms = [step_ms * (1 + (_NOISE[(phase + i) % len(_NOISE)] - 1) * jitter) for i in range(rounds)]
    return CandidateResult(
        candidate=Candidate(device=device, precision=precision),  # type: ignore[arg-type]
        setup_s=setup_s,
        first_step_ms=2 * step_ms,
        timing=Timing(round_ms=round_ms, steps_per_round=1, median_ms=sorted(round_ms)[rounds // 2], spread=0.01,
                      stage=4, final=True),
        numerics=Numerics(losses=[1.0], grad_norms=[1.0], loss_error=0, grad_error=0, update_cosine=1,
                          tolerance=0.01, init_scale=init_scale),
        num_threads=2,
        device_name="Test CPU" if device == "cpu" else f"Test GPU {device}",
    )


def failed(device: str, precision: str, kind: str, detail: str) -> CandidateResult:
    return CandidateResult(
        candidate=Candidate(device=device, precision=precision),  # type: ignore[arg-type]
        failure=Failure(kind=kind, detail=detail),  # type: ignore[arg-type]
    )


def family(kind: str, *results: CandidateResult, notes: dict[str, str] | None = None,
           noisy: bool = False) -> FamilyResult:
    """A record of ``kind``; keyed as the current settings and rules would key it when the kind is registered
    here (a cache test's record then serves as fresh), unkeyed otherwise (another app's kind)."""
    registered = kind in family_names()
    return FamilyResult(
        model_kind=kind, measured_at="2026-11-30T00:00:00+00:00", autotune_version="test", wall_s=1.0,
        budget_s=1.0, candidates=list(results), backend_notes=notes or {}, noisy=noisy,
        key=family_key(get_family(kind)) if registered else None, rules=rules_digest() if registered else None,
    )


def rival(config: Config, label: str) -> Rival:
    """The evidence on the candidate labelled ``label`` (e.g. ``'cpu fp32'``) against ``config``'s pick."""
    assert config.evidence is not None
    found = [r for r in config.evidence.rivals if r.candidate.label == label]
    assert found, f"{label} is not among the rivals: {[r.candidate.label for r in config.evidence.rivals]}"
    return found[0]


def measured(kind: str) -> FamilyResult:
    """``kind`` with fp32 and bf16 on the CPU timed, bf16 twice as fast."""
    return family(kind, timed("cpu", "fp32", 100.0), timed("cpu", "bf16-mixed", 50.0))


def saved_store(root: Path) -> Store:
    """A results store at ``root`` holding cnn and mlp for this machine."""
    store = Store(root)
    fp = fingerprint()
    store.save(fp, measured("cnn"))
    store.save(fp, measured("mlp"))
    return store
