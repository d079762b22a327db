"""Shared pieces of the benchmarks: an in-process oracle and JSON-line output."""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from typing import Any

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

from autotune._calibrate_family import plan
from autotune._families import get_family
from autotune._models import Candidate
from autotune._step import TrainStep
from autotune.backends import backend_for

BUILTINS = ("tiny_mlp", "mlp", "cnn", "transformer")


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def oracle(kind: str, *, steps: int = 200, slow_steps: int = 3, warmup: int = 10) -> dict[str, float]:
    """Median ms/step of every planned candidate, interleaved step by step, in this process.

    Candidates whose warm-up steps are over 10x the fastest (fp16 convolutions on a CPU) get ``slow_steps``
    timed steps: enough to know they are not the best, without spending minutes on them.
    """
    candidates, _ = plan()
    family = get_family(kind)
    runners = {c: TrainStep(family, c, backend_for(c.device), seed=0) for c in candidates}
    warm: dict[Candidate, float] = {}
    for candidate, runner in runners.items():
        times = []
        for _ in range(warmup if not warm or min(warm.values()) * 10 > _one(runner) else 1):
            times.append(_one(runner))
        warm[candidate] = statistics.median(times)
    best = min(warm.values())
    counts = {c: (steps if w < 10 * best else slow_steps) for c, w in warm.items()}
    samples: dict[Candidate, list[float]] = {c: [] for c in runners}
    for index in range(max(counts.values())):
        for candidate, runner in runners.items():
            if index < counts[candidate]:
                samples[candidate].append(_one(runner))
    return {c.label: 1000 * statistics.median(s) for c, s in samples.items()}


def _one(runner: TrainStep) -> float:
    started = time.perf_counter()
    runner.run()
    return time.perf_counter() - started


def families_from_argv() -> list[str]:
    return sys.argv[1:] or list(BUILTINS)


__all__ = ["BUILTINS", "emit", "families_from_argv", "oracle", "torch"]
