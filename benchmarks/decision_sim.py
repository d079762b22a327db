"""Decision quality against known truths: the real search and decision code, many seeded runs per scenario.

Each scenario is a truth profile (``autotune.testing.simulate``): how fast every candidate really is and how
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
- ``sim_s``: simulated calibration seconds (set-up + every timed step), mean;
- ``open_pct``: picks whose evidence names a pair the pick rests on still open when timing stopped (a close
  call its rounds could not afford: served as final, the pair named).

``gpu_clock_drop_in_final`` throttles the GPU during the final comparison: there a CPU pick is expected, and
what counts is that every one of them is flagged noisy (``wrong_not_noisy_pct`` 0).

    python benchmarks/decision_sim.py [--runs N] [SCENARIO ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from autotune._cache.store import StoreFile
from autotune._decide import decide, finalists
from autotune._lab.plan import Facts, fewer_threads
from autotune._records import Candidate, Failure
from autotune._rules import MARGIN, complexity
from autotune.testing.simulate import CandidateTruth, Truth, simulate, true_pick, true_score, truth_from_record

MACHINES = Path(__file__).parent.parent / "fixtures" / "machines"
CPU_THREADS = {"1 thread": 3.0, "4 threads": 1.5}  # an 8-thread CPU: fewer threads are slower
CLOCK_DROP = (8.25, 20.0)  # simulated seconds: from within its final comparison (8.1-8.2 s to 8.3-8.9 s)


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
        # Small steps on a GPU, bound by launching kernels: a loop overlaps launches with the device's work, so
        # fp32 (2.0 ms on the device, 2.6 ms to launch) takes 2.6 ms a step and bf16 (1.0 ms, 2.9 ms: autocast's
        # casts) 2.9 ms. Synchronised step by step they would take 4.6 and 3.9 ms: bf16 "clearly faster". The
        # fused optimizer launches a fifth less: fp32 fused is the space's best.
        "launch_bound_small_steps": (Truth(name="lb", candidates={
            _c("cpu", "fp32"): CandidateTruth(20.0), _c("cpu", "bf16-mixed"): CandidateTruth(30.0),
            _c("cuda:0", "fp32"): CandidateTruth(2.0, setup_s=3.0, launch_ms=2.6),
            _c("cuda:0", "bf16-mixed"): CandidateTruth(1.0, setup_s=3.0, launch_ms=2.9),
            _c("cuda:0", "fp16-mixed"): CandidateTruth(1.0, failure=Failure(kind="numerics", detail="overflow"))},
            variant_factors=CPU_THREADS, variant_launch_factors={"fused-optimizer": 0.8}), None),
        # The GPU 16% faster than the CPU throttles for a while (25% slower, its clock 25% lower) during the final
        # comparison: the CPU control cannot see it, the device's clock can. A pick of the CPU is wrong (the GPU is
        # faster once it recovers) and must be flagged noisy, so the next calibrate() measures again.
        "gpu_clock_drop_in_final": (Truth(name="cd", candidates={
            _c("cpu", "fp32"): CandidateTruth(10.0), _c("cuda:0", "fp32"): CandidateTruth(8.6, setup_s=3.0)},
            variant_factors=CPU_THREADS, clock_drop=CLOCK_DROP), None),
    }
    found.update(close_calls())
    for path in sorted(MACHINES.glob("*.json")):
        stored = StoreFile.model_validate_json(path.read_bytes())
        for kind, measured in stored.families.items():
            found[f"{path.stem}/{kind}"] = (truth_from_record(measured, default_threads=8), None)
            if kind == "detector":
                found[f"{path.stem}/{kind}@60steps"] = (truth_from_record(measured, default_threads=8), 60)
    return found


def close_calls() -> dict[str, tuple[Truth, int | None]]:
    """Same-math gains just past what a pick may give away, in the shapes real CPUs showed."""
    return {
        # tiny_mlp on a busy 2-core machine: 1 thread 6% faster than torch's 2 (the fused optimizer a clear gain),
        # sub-millisecond steps whose rounds vary by 15%, and a load that comes and goes and hurts the step that
        # waits for two threads more than the one that needs one (bf16 noisier still): the pair needs hundreds of
        # rounds, which cost little.
        "tiny_mlp_1_thread_6pct_busy": (Truth(name="tt", candidates={
            _c("cpu", "fp32"): CandidateTruth(0.5, setup_s=0.05),
            _c("cpu", "bf16-mixed"): CandidateTruth(0.8, setup_s=0.05, noise=0.4)},
            variant_factors={"1 thread": 1 / 1.06, "fused-optimizer": 0.75}, default_threads=2, noise=0.3,
            load_correlation=0.8, load_noise=0.2, threads_load=1.0), None),
        # The transformer: bf16 + fused AdamW 3.3% faster than plain bf16, fp16 as fast as bf16 (a tie goes to
        # bf16), ~8% per-round noise: when fp16 leads, bf16 must still meet the fused optimizer.
        "transformer_fused_3.3pct_fp16_ties_bf16": (Truth(name="t3", candidates={
            _c("cpu", "fp32"): CandidateTruth(60.0), _c("cpu", "bf16-mixed"): CandidateTruth(40.0),
            _c("cpu", "fp16-mixed"): CandidateTruth(40.0)},
            variant_factors={**CPU_THREADS, "fused-optimizer": 1 / 1.033}, noise=0.057, switch_penalty=0.03,
            warmup_penalty=0.3), None),
        # A layout gain of 4.5% at 8% per-step noise (channels_last on a cnn; bf16 slower on this CPU).
        "cnn_channels_last_4.5pct_8pct_noise": (Truth(name="c4", candidates={
            _c("cpu", "fp32"): CandidateTruth(100.0), _c("cpu", "bf16-mixed"): CandidateTruth(140.0)},
            variant_factors={**CPU_THREADS, "channels_last": 1 / 1.045},
            facts=Facts(image_inputs=True, default_optimizer=True), noise=0.08, switch_penalty=0.03,
            warmup_penalty=0.3), None),
    }


def run(name: str, truth: Truth, expected_steps: int | None, runs: int) -> dict[str, object]:
    planned = list(truth.candidates)
    right = true_pick(truth, planned, expected_steps)
    best = space_best(truth, expected_steps)
    right_count = claimed = noisy = wrong_final = over = still_open = 0
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
        still_open += bool(pick.evidence is not None and pick.evidence.unresolved)
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
        "open_pct": round(100 * still_open / runs, 1),
    }


def space_best(truth: Truth, expected_steps: int | None) -> float:
    """The true best score of the whole space: each usable plain candidate with every combination of the
    variants the search can reach for it (thread counts on the CPU only, channels_last for image inputs only),
    each at its true step time in a training loop (on an accelerator, launches overlapping the device's work)."""
    scores = []
    for candidate, one in truth.candidates.items():
        if one.failure is not None:
            continue
        layouts = ["contiguous", "channels_last"] if truth.facts.image_inputs else ["contiguous"]
        optimizers = ["default", "fused"] if truth.facts.default_optimizer else ["default"]
        threads = [None, *fewer_threads(truth.default_threads)] if candidate.device == "cpu" else [None]
        for layout, optimizer, count in itertools.product(layouts, optimizers, threads):
            variant = candidate.model_copy(update={"memory_format": layout, "optimizer": optimizer,
                                                   "num_threads": count})
            scores.append(true_score(truth, variant, expected_steps))
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
