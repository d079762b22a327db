"""Decision quality against known truths: the real search and decision code, many seeded runs per scenario.

Each scenario is a truth profile (``autotune._calibration.simulate``): how fast every candidate really is and how
the machine misbehaves while it is measured. The real session (stages, sequential timing, final paired
comparison) measures it on a fake clock, the real ``decide`` picks, and the pick is scored against the pick
the same rules make on the exact truth. Printed per scenario (JSON lines):

- ``right_pct``: the right device and precision (variants of equal truth are not told apart);
- ``faster_claimed_pct``: a lower precision (or a GPU) picked over the simpler answer where the truth says
  it is *not* faster by more than the margin: a wrong "clearly faster" verdict (goal <= 5%);
- ``mean_regret_pct`` / ``p95_regret_pct``: true time of the pick over the true best of the whole search space
  (every precision with every variant the truth has, tried by the search or not), - 1;
- ``over_margin_pct``: picks whose regret exceeds the 3% margin (goal <= 5%);
- ``noisy_pct``: results flagged noisy (served, but measured again by the next ``calibrate()``);
- ``wrong_not_noisy_pct``: a wrong device or precision *not* flagged noisy, so cached as final: confidently
  wrong;
- ``sim_s``: simulated calibration seconds (set-up + every timed step), mean.

    python benchmarks/decision_sim.py [--runs N] [SCENARIO ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from autotune._cache.store import StoreFile
from autotune._calibration.plan import Facts
from autotune._calibration.simulate import CandidateTruth, Truth, simulate, true_pick, true_score, truth_from_record
from autotune._decide import decide, finalists
from autotune._models import Candidate, Failure
from autotune._rules import MARGIN, complexity

MACHINES = Path(__file__).parent.parent / "fixtures" / "machines"
CPU_THREADS = {"1 thread": 3.0, "4 threads": 1.5}  # an 8-thread CPU: fewer threads are slower


def _c(device: str, precision: str) -> Candidate:
    return Candidate(device=device, precision=precision)  # type: ignore[arg-type]


def gpu_family(name: str, fp32_ms: float, bf16_ms: float, *, fused: float = 1.0, **weather: object) -> Truth:
    """A GPU machine where the question is fp32 vs bf16 on the GPU; the CPU is 10x slower, fp16 fails."""
    return Truth(
        name=name,
        candidates={
            _c("cpu", "fp32"): CandidateTruth(10 * fp32_ms),
            _c("cpu", "bf16-mixed"): CandidateTruth(14 * fp32_ms),
            _c("cuda:0", "fp32"): CandidateTruth(fp32_ms, setup_s=3.0),
            _c("cuda:0", "bf16-mixed"): CandidateTruth(bf16_ms, setup_s=3.0),
            _c("cuda:0", "fp16-mixed"): CandidateTruth(bf16_ms, failure=Failure(kind="numerics", detail="overflow")),
        },
        variant_factors={**CPU_THREADS, "fused-optimizer": fused},
        **weather,  # type: ignore[arg-type]
    )


def scenarios() -> dict[str, tuple[Truth, int | None]]:
    found: dict[str, tuple[Truth, int | None]] = {
        "gap_10x": (gpu_family("gap_10x", 51.0, 5.9), None),
        "equal": (gpu_family("equal", 20.0, 20.0), None),
        **{f"gain_{g}pct": (gpu_family(f"gain_{g}pct", 20.0, 20.0 / (1 + g / 100)), None)
           for g in (2.99, 3.5, 5, 10)},
        "equal_slowdown_10pct_between_stages": (gpu_family("s", 20.0, 20.0, slowdown_after_stage_1=1.10), None),
        "equal_ramp_2pct_per_s": (gpu_family("r", 20.0, 20.0, ramp_per_s=0.02), None),
        "equal_outliers_5pct_3x": (gpu_family("o", 20.0, 20.0, outlier_rate=0.05), None),
        "gain_2.99pct_outliers_5pct_3x": (gpu_family("go", 20.0, 20.0 / 1.0299, outlier_rate=0.05), None),
        "equal_burst_halfway": (gpu_family("b", 20.0, 20.0, burst=(12.0, 16.0)), None),
        # Outliers beyond the 4x one-round far-behind rule: one disturbed first round must not drop anything.
        "equal_outliers_5pct_6x": (gpu_family("o6", 20.0, 20.0, outlier_rate=0.05, outlier_factor=6.0), None),
        # A background load that comes and goes slowly (AR(1), 0.95 step to step, 10%): rounds are correlated.
        "equal_slow_load": (gpu_family("l", 20.0, 20.0, load_correlation=0.95, load_noise=0.10), None),
        # Another program on the cores: a third of the steps 4x slower, one step a round (a 20 ms step).
        "gain_45pct_contention_30pct_4x": (gpu_family("c", 20.0, 20.0 / 1.45, outlier_rate=0.3,
                                                      outlier_factor=4.0), None),
        "gain_2.99pct_slow_load": (gpu_family("gl", 20.0, 20.0 / 1.0299, load_correlation=0.95, load_noise=0.10),
                                   None),
        "cpu_vs_gpu_equal": (Truth(name="cg", candidates={
            _c("cpu", "fp32"): CandidateTruth(10.0), _c("cuda:0", "fp32"): CandidateTruth(10.0, setup_s=3.0)},
            variant_factors=CPU_THREADS), None),
        "fused_optimizer_2pct": (gpu_family("f", 20.0, 10.0, fused=0.98), None),
        # At the margin. The transformer's shape: bf16 as fast as fp16, the fused optimizer 4.5% faster, ~8%
        # per-round noise (5.7% a step), a step after another candidate's 3% slower, warm-up transients.
        "transformer_fused_4.5pct": (Truth(name="tf", candidates={
            _c("cpu", "fp32"): CandidateTruth(60.0), _c("cpu", "bf16-mixed"): CandidateTruth(40.0),
            _c("cpu", "fp16-mixed"): CandidateTruth(40.0)},
            variant_factors={**CPU_THREADS, "fused-optimizer": 1 / 1.045}, noise=0.057, switch_penalty=0.03,
            warmup_penalty=0.3), None),
        # The cnn's near-tie: the fused optimizer 1.3% faster (either answer is within the margin).
        "cnn_fused_near_tie_1.3pct": (Truth(name="cn", candidates={
            _c("cpu", "fp32"): CandidateTruth(100.0), _c("cpu", "bf16-mixed"): CandidateTruth(58.0)},
            variant_factors={**CPU_THREADS, "channels_last": 0.7, "fused-optimizer": 1 / 1.013},
            facts=Facts(image_inputs=True, default_optimizer=True), noise=0.057, switch_penalty=0.03), None),
        # Rivals 2.99% faster than fp32 on its device (not beyond the margin), each with a heavy tail of its own,
        # and a fused optimizer that changes nothing: a false "clearly faster" verdict is a pick of any of them.
        "rivals_2.99pct_heavy_tails": (Truth(name="rv", candidates={
            _c("cpu", "fp32"): CandidateTruth(200.0), _c("cuda:0", "fp32"): CandidateTruth(20.0, setup_s=3.0),
            **{_c("cuda:0", p): CandidateTruth(20.0 / 1.0299, setup_s=3.0, outlier_rate=0.05, outlier_factor=3.0)
               for p in ("tf32", "bf16-mixed", "fp16-mixed")}}, variant_factors=CPU_THREADS), None),
        **{f"gain_{g}pct_drift_heavy_tails": (gpu_family(f"d{g}", 20.0, 20.0 / (1 + g / 100), ramp_per_s=0.01,
                                                          outlier_rate=0.05, switch_penalty=0.03), None)
           for g in (3.5, 4.5, 6)},
        # Several precisions within a few percent of one another on one device: every pair is contested.
        "contested_precisions": (Truth(name="cp", candidates={
            _c("cpu", "fp32"): CandidateTruth(200.0), _c("cuda:0", "fp32"): CandidateTruth(20.0, setup_s=3.0),
            _c("cuda:0", "tf32"): CandidateTruth(19.8, setup_s=3.0),
            _c("cuda:0", "bf16-mixed"): CandidateTruth(19.6, setup_s=3.0),
            _c("cuda:0", "fp16-mixed"): CandidateTruth(18.5, setup_s=3.0)},
            variant_factors={**CPU_THREADS, "fused-optimizer": 0.9}), None),
        # fp32 and bf16 tie on the CPU and channels_last makes both 1.6x faster: fp32 channels_last is the
        # answer, found only when the leader's layout is tried in the other precision too.
        "cpu_tie_channels_last": (Truth(name="cl", candidates={
            _c("cpu", "fp32"): CandidateTruth(50.0), _c("cpu", "bf16-mixed"): CandidateTruth(50.0)},
            variant_factors={**CPU_THREADS, "channels_last": 0.6},
            facts=Facts(image_inputs=True, default_optimizer=True)), None),
    }
    for path in sorted(MACHINES.glob("*.json")):
        stored = StoreFile.model_validate_json(path.read_bytes())
        for kind, measured in stored.families.items():
            found[f"{path.stem}/{kind}"] = (truth_from_record(measured, default_threads=8), None)
            if kind == "detector":
                found[f"{path.stem}/{kind}@60steps"] = (truth_from_record(measured, default_threads=8), 60)
    return found


def run(name: str, truth: Truth, expected_steps: int | None, runs: int) -> dict[str, object]:
    planned = list(truth.candidates)
    right = true_pick(truth, planned, expected_steps)
    best = space_best(truth, expected_steps)
    right_count = claimed = noisy = wrong_final = over = 0
    regrets, seconds = [], []
    for seed in range(runs):
        measured, sim_s = simulate(truth, seed)
        pick = decide(measured, expected_steps=expected_steps, digest="sim")
        chosen = next(r.candidate for r in finalists(measured)  # an outpaced device's answer is one too
                      if (r.candidate.device, r.candidate.precision, r.candidate.variants)
                      == (pick.device, pick.precision, pick.variants))
        is_right = (chosen.device, chosen.precision) == (right.device, right.precision)
        right_count += is_right
        claimed += _more_complex(chosen, right)
        noisy += measured.noisy
        wrong_final += not is_right and not measured.noisy  # confidently wrong: served as final
        regrets.append(true_score(truth, chosen, expected_steps) / best - 1)
        over += regrets[-1] > MARGIN + 1e-9
        seconds.append(sim_s)
    regrets.sort()
    return {
        "benchmark": "decision_sim", "scenario": name, "runs": runs,
        "right_answer": f"{right.device} {right.precision}",
        "right_pct": round(100 * right_count / runs, 1),
        "faster_claimed_pct": round(100 * claimed / runs, 1),
        "over_margin_pct": round(100 * over / runs, 1),
        "mean_regret_pct": round(100 * statistics.fmean(regrets), 2),
        "p95_regret_pct": round(100 * regrets[int(0.95 * (runs - 1))], 2),
        "noisy_pct": round(100 * noisy / runs, 1),
        "wrong_not_noisy_pct": round(100 * wrong_final / runs, 1),
        "sim_s": round(statistics.fmean(seconds), 1),
    }


def space_best(truth: Truth, expected_steps: int | None) -> float:
    """The true best score of the whole space: each usable plain candidate with the best of every variant the
    truth has for it (a thread count on the CPU only, channels_last for image inputs only)."""
    scores = []
    for candidate, one in truth.candidates.items():
        if one.failure is None:
            factors = truth.factors(candidate)
            threads = min([1.0, *(f for word, f in factors.items() if word.endswith(("thread", "threads")))])
            layout = min(1.0, factors.get("channels_last", 1.0)) if truth.facts.image_inputs else 1.0
            fused = min(1.0, factors.get("fused-optimizer", 1.0)) if truth.facts.default_optimizer else 1.0
            step = one.step_ms * layout * fused * (threads if candidate.device == "cpu" else 1.0)
            scores.append(step if expected_steps is None else 1000 * one.setup_s + expected_steps * step)
    return min(scores)


def _more_complex(chosen: Candidate, right: Candidate) -> bool:
    """A wrong "clearly faster" verdict: a lower precision or a GPU where the truth says the simpler answer."""
    if chosen.device != right.device:
        return right.device == "cpu"
    return complexity(chosen)[0] > complexity(right)[0]


def main(argv: list[str] | None = None, emit: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("scenario", nargs="*")
    args = parser.parse_args(argv)
    for name, (truth, steps) in scenarios().items():
        if not args.scenario or name in args.scenario:
            emit(json.dumps(run(name, truth, steps, args.runs)))


if __name__ == "__main__":
    main(sys.argv[1:])
