"""Does ``dataloader_report`` see the loop's workers? Samples that wait 60 ms each (a read from a slow disk), 32 a
batch: each setting it measured against the real loop with that setting, and its answer against the best of them.

The Config is made by hand for ``tiny_mlp`` on the CPU with the step time calibration would record: its training
step timed here on a batch in memory, at the family's batch. Each real loop trains ``tiny_mlp`` (its model, its
loss, SGD) over a DataLoader with the measured setting (workers that persist, its prefetch, its training threads),
after each worker's first batch, over three more of each worker's (at least three batches): the steady rate the
measurement claims to see. Rates are ms per batch.

    python benchmarks/loader_sleep.py [--wait-ms 60] [--batch-size 32] [--budget 5]
    python benchmarks/loader_sleep.py --quick     # 5 ms samples, 8 a batch: checks the script runs, not a figure

Goals: each measured setting's loop within 15% of the real loop's; the answer's real loop within 5% of the best
measured setting's real loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
from _common import emit
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune._families import get_family


class Waits(Dataset[tuple[torch.Tensor, int]]):
    """``length`` hand-landmark vectors, each after a wait of ``wait_s``."""

    def __init__(self, length: int, wait_s: float) -> None:
        self.length = length
        self.wait_s = wait_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.wait_s)
        return torch.full((63,), float(index % 7)), index % 10


class Training:
    """``tiny_mlp``'s training step on the CPU, as a loop runs it."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        workload = get_family("tiny_mlp").build()
        self.model, self.loss, self.inputs = workload.model, workload.loss, workload.inputs
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def step(self, batch: Any) -> None:
        loss = self.loss(self.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def step_ms(self) -> float:
        """The step alone on the family's batch in memory: the median of 200, after 20."""
        times = []
        for count in range(220):
            started = time.perf_counter()
            self.step(self.inputs)
            if count >= 20:
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)


def _forever(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def real_loop_ms(dataset: Waits, training: Training, kwargs: dict[str, Any], threads: int | None) -> float:
    """ms per batch of the real loop with ``kwargs``: after each worker's first batch, over three more of each."""
    if threads is not None:
        torch.set_num_threads(threads)
    workers = kwargs.get("num_workers", 0)
    loader = DataLoader(dataset, **kwargs)
    batches = _forever(loader)
    for _ in range(max(1, workers)):
        training.step(next(batches))
    timed = max(3, 3 * workers)
    started = time.perf_counter()
    for _ in range(timed):
        training.step(next(batches))
    elapsed_ms = (time.perf_counter() - started) * 1000
    del batches, loader  # its workers end with it
    return elapsed_ms / timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait-ms", type=float, default=60.0, help="each sample's wait")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--budget", type=float, default=None, help="the measurement's budget_s (its default)")
    parser.add_argument("--quick", action="store_true", help="5 ms samples, 8 a batch, a 1 s budget")
    args = parser.parse_args()
    if args.quick:
        args.wait_ms, args.batch_size, args.budget = 5.0, 8, 1.0
    threads = torch.get_num_threads()
    training = Training()
    step_ms = training.step_ms()
    dataset = Waits(256 * args.batch_size, args.wait_ms / 1000)
    with tempfile.TemporaryDirectory() as cache:  # a fresh answer, measured in this run; yours stay as they are
        os.environ["AUTOTUNE_CACHE_DIR"] = cache
        config = autotune.Config(model_kind="tiny_mlp", device="cpu", precision="fp32", source="measured",
                                 reason="benchmark", fingerprint_digest=autotune.fingerprint().digest,
                                 step_ms=step_ms)
        report = config.dataloader_report(dataset, batch_size=args.batch_size, budget_s=args.budget)
        tuned = config.dataloader_kwargs(dataset, batch_size=args.batch_size)  # from the cache; sets the threads
    emit({"benchmark": "loader_sleep", "wait_ms": args.wait_ms, "batch_size": args.batch_size,
          "step_ms": round(step_ms, 3), "measured_s": round(report.wall_s, 1), "budget_s": report.budget_s,
          "reason": report.reason})
    best_ms = None
    for trial in report.trials:
        if trial.loop_ms is None:
            continue
        kwargs: dict[str, Any] = {"batch_size": args.batch_size, "num_workers": trial.num_workers}
        if trial.num_workers:
            kwargs.update(persistent_workers=True, prefetch_factor=trial.prefetch_factor)
        real_ms = real_loop_ms(dataset, training, kwargs, trial.num_threads)
        best_ms = real_ms if best_ms is None else min(best_ms, real_ms)
        emit({"benchmark": "loader_sleep", "num_workers": trial.num_workers, "threads": trial.num_threads,
              "prefetch_factor": trial.prefetch_factor, "measured_ms": round(trial.loop_ms, 1),
              "real_ms": round(real_ms, 1), "measured_vs_real": round(trial.loop_ms / real_ms, 3),
              "within_15%": abs(trial.loop_ms / real_ms - 1) <= 0.15})
    answer_ms = real_loop_ms(dataset, training, tuned, report.num_threads or threads)
    emit({"benchmark": "loader_sleep", "summary": True, "answer": report.tuned(),
          "answer_threads": report.num_threads or threads, "answer_real_ms": round(answer_ms, 1),
          "best_real_ms": round(best_ms or answer_ms, 1),
          "answer_vs_best": round(answer_ms / (best_ms or answer_ms), 3),
          "within_5%": answer_ms <= 1.05 * (best_ms or answer_ms)})


if __name__ == "__main__":
    main()
