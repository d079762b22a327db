"""Known truths for the simulator's tests: a GPU machine of given step times and weather, and the picks the real
decision code makes from seeded simulated measurements.
"""

from __future__ import annotations

from autotune._decide import decide
from autotune._records import Candidate, Failure
from autotune.testing.simulate import simulate
from autotune.testing.truth import CandidateTruth, Truth

SEEDS = range(20)


def on(device: str, precision: str) -> Candidate:
    return Candidate(device=device, precision=precision)  # type: ignore[arg-type]


def gpu_machine(fp32_ms: float, bf16_ms: float, **weather: object) -> Truth:
    return Truth(
        name="sim",
        candidates={
            on("cpu", "fp32"): CandidateTruth(10 * fp32_ms),
            on("cpu", "bf16-mixed"): CandidateTruth(14 * fp32_ms),
            on("cuda:0", "fp32"): CandidateTruth(fp32_ms, setup_s=3.0),
            on("cuda:0", "bf16-mixed"): CandidateTruth(bf16_ms, setup_s=3.0),
            on("cuda:0", "fp16-mixed"): CandidateTruth(bf16_ms, failure=Failure(kind="numerics", detail="overflow")),
        },
        variant_factors={"1 thread": 3.0, "4 threads": 1.5, **weather.pop("factors", {})},  # type: ignore[dict-item]
        **weather,  # type: ignore[arg-type]
    )


def picks(truth: Truth, seeds: range = SEEDS, **kwargs: object) -> list[tuple[str, str]]:
    out = []
    for seed in seeds:
        measured, _ = simulate(truth, seed)
        config = decide(measured, digest="sim", **kwargs)  # type: ignore[arg-type]
        out.append((config.device, config.precision))
    return out
