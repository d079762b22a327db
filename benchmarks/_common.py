"""Shared pieces of the benchmarks: an in-process oracle and JSON-line output."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

from autotune._apply import axes
from autotune._apply import fp32 as _fp32
from autotune._config import Config
from autotune._decide import decision_alpha, finalists, pick_fastest
from autotune._families import get_family
from autotune._lab.measure import per_step_s
from autotune._lab.plan import plan
from autotune._lab.step import TrainStep
from autotune._records import Candidate, FamilyResult
from autotune._variants import Situation, reachable
from autotune._wording import headline
from autotune.backends import backend_for

BUILTINS = ("tiny_mlp", "mlp", "cnn", "transformer")


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def search_space(kind: str) -> list[Candidate]:
    """Every candidate the default search could pick for ``kind`` here: precisions x layout x optimizer x threads.

    The staged search only tries variants of its leaders; the oracle times the whole cross product, so a
    combination the search never tried still counts against its pick.
    """
    planned, _ = plan()
    facts = axes.facts(get_family(kind).build())
    space = []
    for base in planned:
        space += reachable(base, Situation(facts=facts, device=base.device, search="default",
                                           default_threads=torch.get_num_threads()))
    return space


def oracle(
    kind: str, *, extra: Sequence[Candidate] = (), steps: int = 200, warmup: int = 10,
    space: list[Candidate] | None = None, block_s: float = 0.01, resolve: float = 0.0, resolve_s: float = 45.0,
    errors: dict[str, float] | None = None,
) -> dict[str, float]:
    """Mean ms/step of every candidate in the search space, timed in-process in interleaved blocks of steps.

    A block lasts at least ``block_s`` (one step for most models; tens of steps for a sub-millisecond MLP), so
    each candidate runs as an app runs it, with its thread count steady, rather than one step right after
    another candidate switched the thread pool; the figure is the median block's mean. After warm-up,
    candidates within 1.5x of the fastest get ``steps`` timed steps (at least 20 blocks); the rest 10 (enough
    to rank them, cheap for fp16 convolutions on a CPU at over a second a step, which get 1 warm-up step).
    ``space`` replaces the whole search space (e.g. only the planned device x precision candidates).

    ``resolve`` > 0: the fastest candidate and every one within ``resolve`` of it (the ``extra`` ones always) are
    then timed on, together, in more interleaved blocks until each one's ratio to the fastest is known to +-0.3%
    (or ``resolve_s`` has passed), and their figures become the fastest's times the median of their paired
    per-block ratios: 20 blocks resolve a sub-millisecond MLP's ratios to +-4% on a shared machine, too coarse
    to tell a 1% regret from a 4% one. The unresolved figures are rescaled by the fastest's resolved / first
    figure, so all are on one scale should the machine have changed speed meanwhile. ``errors`` receives each
    resolved ratio's standard error.
    """
    family = get_family(kind)
    candidates = list(dict.fromkeys([*(search_space(kind) if space is None else space), *extra]))
    fp32_host = _fp32.current()
    runners = {c: TrainStep(family, c, backend_for(c.device), seed=0, fp32_host=fp32_host) for c in candidates}
    warm: dict[Candidate, float] = {}
    for candidate, runner in runners.items():
        first = _block(runner, 1)
        count = warmup if first < 0.5 or not warm else 1
        more = [_block(runner, 1) for _ in range(count - 1)] if count > 1 else []
        warm[candidate] = statistics.median([first, *more])
    best = min(warm.values())
    per_block = {c: max(1, math.ceil(block_s / w)) for c, w in warm.items()}
    blocks = {c: (max(20, steps // per_block[c]) if w < 1.5 * best else (10 if w < 10 * best else 1))
              for c, w in warm.items()}
    samples: dict[Candidate, list[float]] = {c: [] for c in runners}
    for index in range(max(blocks.values())):
        for candidate, runner in runners.items():
            if index < blocks[candidate]:
                samples[candidate].append(_block(runner, per_block[candidate]))
    truth = {c.label: 1000 * statistics.median(s) for c, s in samples.items()}
    if resolve > 0:
        fastest = min(truth, key=truth.__getitem__)
        resolved = _resolved(runners, samples, per_block, [*extra, *(
            c for c in candidates if truth[c.label] <= (1 + resolve) * truth[fastest])], resolve_s,
            {} if errors is None else errors)
        if resolved:  # the rest on the same scale, should the machine have changed speed meanwhile
            scale = resolved[fastest] / truth[fastest]
            truth = {label: resolved.get(label, ms * scale) for label, ms in truth.items()}
    return truth


def _resolved(
    runners: dict[Candidate, TrainStep], samples: dict[Candidate, list[float]], per_block: dict[Candidate, int],
    near: list[Candidate], limit_s: float, errors: dict[str, float], target_se: float = 0.003,
) -> dict[str, float]:
    """The fastest of ``near`` and the others' paired ratios to it, timed in fresh interleaved blocks."""
    near = list(dict.fromkeys(near))
    if len(near) < 2:
        return {}
    fastest = min(near, key=lambda c: statistics.median(samples[c]))
    fresh: dict[Candidate, list[float]] = {c: [] for c in near}

    def log_ratios(candidate: Candidate) -> list[float]:
        return [math.log(a / b) for a, b in zip(fresh[candidate], fresh[fastest], strict=True)]

    def error(candidate: Candidate) -> float:
        ratios = log_ratios(candidate)  # the median's standard error, about 1.25x the mean's
        return 1.25 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) >= 30 else float("inf")

    started = time.perf_counter()
    while not fresh[fastest] or (time.perf_counter() - started < limit_s and not all(
            error(c) <= target_se for c in near if c != fastest)):
        order = near if len(fresh[fastest]) % 2 == 0 else near[::-1]
        for candidate in order:
            fresh[candidate].append(_block(runners[candidate], per_block[candidate]))
    base = 1000 * statistics.median(fresh[fastest])
    errors.update({c.label: error(c) for c in near if c != fastest})
    return {c.label: base * math.exp(statistics.median(log_ratios(c))) if c != fastest else base for c in near}


def picked(measured: FamilyResult) -> Candidate:
    """The candidate ``best_config(kind)`` answers with (prefer="auto"), as a full candidate with its variants."""
    return pick_fastest(finalists(measured), None, alpha=decision_alpha(measured.candidates)).candidate


def stated_headline(config: Config) -> tuple[Candidate, float, bool] | None:
    """The figure the reason states for the pick against plain fp32 on its device: (that fp32, the ratio, whether
    it is a bound: "at least"); None where it states none (an fp32 pick, a chain of evidence that breaks)."""
    evidence = config.evidence
    fp32 = Candidate(device=config.device, precision="fp32")
    found = next((r for r in evidence.rivals if r.candidate == fp32), None) if evidence is not None else None
    if evidence is None or found is None or config.precision == "fp32":
        return None
    claim = headline(found, config.candidate, evidence)
    return (fp32, *claim) if claim is not None else None


def _block(runner: TrainStep, steps: int) -> float:
    """Mean seconds per step over ``steps`` steps, as a training loop sees them (``per_step_s``: on an
    accelerator, each step of a span on the device's own clock, batches pinned and copied non_blocking); the
    thread count is set outside."""
    with runner.selected():
        return statistics.fmean(per_step_s(runner, time.perf_counter, steps, spans=runner.asynchronous))


def families_from_argv() -> list[str]:
    return sys.argv[1:] or list(BUILTINS)


__all__ = ["BUILTINS", "emit", "families_from_argv", "oracle", "picked", "search_space", "torch"]
