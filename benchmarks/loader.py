"""The loop end to end: a built-in family's training on the CPU fed by a DataLoader whose loading costs about as much
as the step, at ``num_workers=0``, at ``os.cpu_count()``, at Lightning's suggestion and with
``cfg.dataloader_kwargs``, side by side in one run.

The dataset is synthetic images, each made from its index and put through a real CPU transform (a random crop and
flip, then passes of a 5x5 blur: a decoder's and an augmentation's kind of work), with as many blur passes as make
a batch's loading on one thread cost ``--load-ratio`` times the training step. Every contender's loader keeps its
workers between epochs (``persistent_workers``), so the comparison is of worker counts and training threads, not of
worker restarts; the untuned ones train with the config's threads, the tuned one with those it measured with.
Each round times a block of steps of every contender, in an order rotated from round to round, after draining the
batches its workers prefetched while the others ran; samples/s are compared as paired ratios with 95% intervals.
The guard's data-wait share (``guard.data``) is printed for each, and what ``dataloader_kwargs`` cost to measure.

    python benchmarks/loader.py [--kind cnn] [--batch-size 32] [--load-ratio 1.0] [--rounds 12] [--steps 8]
    python benchmarks/loader.py --quick        # a short run that checks the script works, not a figure

Goals: the tuned loop >= the best of the others within 5%, and >= 1.3x ``num_workers=0`` where that loop is
data-bound (the guard sees it wait over 25% of its time).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from collections.abc import Generator
from typing import Any

import torch
import torch.nn.functional as F
from _common import emit
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune import _stats
from autotune._families import get_family
from autotune._guard.watch import DATA_WAIT_SHARE


class Images(Dataset[tuple[torch.Tensor, int]]):
    """``length`` 3 x ``size`` x ``size`` images made from their index: a random crop of a larger one, a random
    flip, ``passes`` 5x5 blurs, normalised; ten classes."""

    def __init__(self, length: int, size: int, passes: int) -> None:
        self.length = length
        self.size = size
        self.passes = passes
        self.kernel = torch.ones(3, 1, 5, 5) / 25

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        full = torch.rand(1, 3, self.size + 8, self.size + 8, generator=generator)
        top, left = (int(v) for v in torch.randint(0, 9, (2,), generator=generator))
        image = full[:, :, top:top + self.size, left:left + self.size]
        if torch.rand((), generator=generator) < 0.5:
            image = image.flip(-1)
        for _ in range(self.passes):
            image = F.conv2d(image, self.kernel, padding=2, groups=3)
        image = (image - image.mean()) / (image.std() + 1e-6)
        return image[0].contiguous(), index % 10


class Contender:
    """One DataLoader setting and the training threads it runs with, its own model, optimizer and guard."""

    def __init__(self, name: str, config: autotune.Config, dataset: Images, kwargs: dict[str, Any],
                 threads: int) -> None:
        self.name = name
        self.config = config
        self.kwargs = kwargs
        self.threads = threads
        torch.manual_seed(0)
        workload = get_family(config.model_kind).build()
        self.model, self.optimizer = config.prepare(workload.model, workload.optimizer)
        self.loss = workload.loss
        self.guard = autotune.Guard(config.model_kind, config.candidate, config.fingerprint_digest,
                                    step_ms=config.step_ms)
        self.stream = _forever(DataLoader(dataset, **kwargs))
        self.samples_per_s: list[float] = []

    def block(self, steps: int) -> None:
        """Drain what the workers prefetched meanwhile, then time ``steps`` training steps, a pass of the guard's
        (what it keeps at a pass's end is written after the last step's time is taken)."""
        torch.set_num_threads(self.threads)
        prefetched = self.kwargs.get("num_workers", 0) * self.kwargs.get("prefetch_factor", 2)
        for batch in itertools.islice(self.stream, prefetched + 1):
            self._step(batch)
        started = ended = time.perf_counter()
        samples = 0
        for batch in self.guard.data(itertools.islice(self.stream, steps)):
            samples += self._step(batch)
            ended = time.perf_counter()
        self.samples_per_s.append(samples / (ended - started))

    def _step(self, batch: Any) -> int:
        images, labels = self.config.prepare_batch(batch)
        with self.config.autocast():
            loss = self.loss(self.model, (images, labels))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.guard.step(loss)
        return len(labels)


def _forever(loader: DataLoader[Any]) -> Generator[Any, None, None]:
    """Epoch after epoch; closing it ends the loader's workers."""
    while True:
        yield from loader


def _passes(config: autotune.Config, batch_size: int, size: int, load_ratio: float) -> tuple[int, float, float]:
    """Blur passes that make a batch's loading on one thread cost ``load_ratio`` training steps; with the step's
    and one pass's ms per batch."""
    torch.manual_seed(0)
    workload = get_family(config.model_kind).build(batch_size)
    model, optimizer = config.prepare(workload.model, workload.optimizer)
    inputs = config.prepare_batch(workload.inputs)

    def step() -> None:
        with config.autocast():
            loss = workload.loss(model, inputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    started = time.perf_counter()
    for _ in range(10):
        step()
    step_ms = (time.perf_counter() - started) * 100
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = {}
        for passes in (0, 4):
            dataset = Images(batch_size, size, passes)
            dataset[0]
            started = time.perf_counter()
            for index in range(batch_size):
                dataset[index]
            costs[passes] = (time.perf_counter() - started) * 1000
    finally:
        torch.set_num_threads(threads)
    per_pass_ms = max(1e-3, (costs[4] - costs[0]) / 4)
    return max(0, round((load_ratio * step_ms - costs[0]) / per_pass_ms)), step_ms, per_pass_ms


def _lightning_workers() -> tuple[int, str]:
    """What Lightning's warning suggests for one process, and where the figure came from."""
    try:
        from lightning.fabric.utilities.data import suggested_max_num_workers
    except ImportError:
        return max(1, (os.cpu_count() or 1) - 1), "cpu_count - 1 (Lightning's rule; Lightning not installed)"
    return suggested_max_num_workers(1), "lightning.fabric.utilities.data.suggested_max_num_workers(1)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="cnn", help="a built-in family whose inputs are 3 x 64 x 64 images")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    parser.add_argument("--threads", type=int, default=None, help="the config's training threads (torch's default)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--load-ratio", type=float, default=1.0, help="a batch's loading on one thread / the step")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per block")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 steps: checks the script runs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 3
    with tempfile.TemporaryDirectory() as cache:  # a fresh answer, measured in this run; yours stay as they are
        os.environ["AUTOTUNE_CACHE_DIR"] = cache
        threads = args.threads or torch.get_num_threads()
        config = autotune.Config(model_kind=args.kind, device="cpu", precision=args.precision, num_threads=args.threads,
                                 source="measured", reason="benchmark",
                                 fingerprint_digest=autotune.fingerprint().digest)
        size = 64
        passes, step_ms, per_pass_ms = _passes(config, args.batch_size, size, args.load_ratio)
        dataset = Images(64 * args.batch_size, size, passes)
        started = time.perf_counter()
        tuned_kwargs = config.dataloader_kwargs(dataset, batch_size=args.batch_size)
        measured_s = time.perf_counter() - started
        started = time.perf_counter()
        report = config.dataloader_report(dataset, batch_size=args.batch_size)
        cached_ms = (time.perf_counter() - started) * 1000
        tuned_threads = torch.get_num_threads()  # dataloader_kwargs applies what it measured with
        lightning, lightning_from = _lightning_workers()
        workers = {"num_workers=0": 0, "os.cpu_count()": os.cpu_count() or 1, "lightning": lightning}
        contenders = [
            *(Contender(name, config, dataset, {"batch_size": args.batch_size, "num_workers": count,
                                                **({"persistent_workers": True} if count else {})}, threads)
              for name, count in workers.items()),
            Contender("dataloader_kwargs", config, dataset, tuned_kwargs, tuned_threads),
        ]
        emit({"benchmark": "loader", "kind": args.kind, "precision": args.precision, "batch_size": args.batch_size,
              "cpu_count": os.cpu_count(), "config_threads": threads, "step_alone_ms": round(step_ms, 2),
              "blur_passes": passes, "load_ms_per_batch_one_thread": round(passes * per_pass_ms, 1),
              "lightning_workers": lightning, "lightning_from": lightning_from,
              "tuned": {k: v for k, v in tuned_kwargs.items() if k != "batch_size"}, "tuned_threads": tuned_threads,
              "reason": report.reason, "measure_s": round(measured_s, 2), "measure_wall_s": round(report.wall_s, 2),
              "budget_s": report.budget_s, "cached_answer_ms": round(cached_ms, 2)})
        order = list(range(len(contenders)))
        for round_index in range(args.rounds):
            rotated = order[round_index % len(order):] + order[:round_index % len(order)]
            for index in rotated:
                contenders[index].block(args.steps)
        tuned = contenders[-1]
        for contender in contenders:
            summary = contender.guard.summary()
            ratio, low, high = _stats.ratio_interval(tuned.samples_per_s, contender.samples_per_s, alpha=0.025)
            emit({"benchmark": "loader", "contender": contender.name,
                  "kwargs": {k: v for k, v in contender.kwargs.items() if k != "batch_size"},
                  "threads": contender.threads, "samples_per_s": round(_stats.median(contender.samples_per_s), 1),
                  "guard_data_wait_share": round(summary.data_wait_share or 0.0, 3),
                  "tuned_over_this": round(ratio, 3), "interval": [round(low, 3), round(high, 3)]})
        others = contenders[:-1]
        best = max(others, key=lambda c: _stats.median(c.samples_per_s))
        vs_best = _stats.ratio_interval(tuned.samples_per_s, best.samples_per_s, alpha=0.025)
        without = contenders[0]
        vs_without = _stats.ratio_interval(tuned.samples_per_s, without.samples_per_s, alpha=0.025)
        data_bound = (without.guard.summary().data_wait_share or 0.0) > DATA_WAIT_SHARE
        emit({"benchmark": "loader", "summary": True, "rounds": args.rounds, "steps_per_block": args.steps,
              "best_other": best.name, "tuned_over_best": round(vs_best[0], 3),
              "tuned_over_best_interval": [round(vs_best[1], 3), round(vs_best[2], 3)],
              "goal_within_5pct_of_best": vs_best[0] >= 0.95,
              "tuned_over_workers_0": round(vs_without[0], 3),
              "tuned_over_workers_0_interval": [round(vs_without[1], 3), round(vs_without[2], 3)],
              "workers_0_data_bound": data_bound,
              "goal_1_3x_where_data_bound": (vs_without[0] >= 1.3) if data_bound else None,
              "quick": args.quick})
        for contender in contenders:
            contender.stream.close()


if __name__ == "__main__":
    main()
