"""``cfg.dataloader_kwargs``: real datasets, real DataLoaders with real worker processes, the config's recorded step
time spent on the CPU; the answer's shape, its cache and the decision on its own measurements. The per-sample cost
that makes a loop data-bound is a real transform (a blur of a small image).

Which setting is fastest on this machine is the benchmark's to show (``benchmarks/loader.py``); the tests assert
what does not depend on the machine's speed: the shape of the answer, the decision on its own measurements, and
every bad input's clear answer. What fails: test_loader_failures.py; what the measurement leaves:
test_loader_leaves.py.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_for_tests import BUDGET_S, Blurred, Vectors, hand_config
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    SequentialSampler,
    TensorDataset,
)

from autotune import ConfigurationError, LoaderReport, LoaderTrial
from autotune._families import get_family
from autotune._records import Ranks
from autotune._tools.loader import KEEP_UP, choose, keeps_up, step_at
from autotune.backends import _linux


class Rescaled(Dataset[torch.Tensor]):
    """Samples whose size changes each time the first is read, as a scale drawn at each epoch's start does (a
    multi-scale augmentation): ``reads`` counts those reads, in whichever process (a file: the measurement reads
    apart)."""

    def __init__(self, counter: Path) -> None:
        self.counter = counter

    @property
    def reads(self) -> int:
        return len(self.counter.read_text()) if self.counter.exists() else 0

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            with self.counter.open("a") as counter:
                counter.write("x")
        return torch.full((8 + self.reads,), float(index))


def shifted(batch: list[torch.Tensor], by: float = 0.0) -> torch.Tensor:
    return torch.stack(batch) + by


class Stacked:
    def __call__(self, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch)


class Summed:
    def __call__(self, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch).sum(dim=1)


def test_in_memory_tensors_need_no_workers_and_the_answer_is_cached() -> None:
    images = TensorDataset(torch.randn(256, 3, 64, 64), torch.randint(0, 10, (256,)))
    config = hand_config("cnn", step_ms=40.0)  # a small CNN's step on a CPU core, at its batch of 32
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    report = config.dataloader_report(images, batch_size=16, budget_s=BUDGET_S)
    assert report.num_workers == 0 and [t.num_workers for t in report.trials] == [0]  # it kept up: nothing costlier
    assert keeps_up(report.trials[0], report.step_ms or 0.0)
    assert report.reason.startswith("num_workers=0 with 1 training thread: the loop kept up with the training step "
                                    "without workers (") and "per training step, the step alone" in report.reason
    assert report.dataset == ("torch.utils.data.dataset.TensorDataset of 256 samples, each (Tensor[float32, "
                              "3x64x64], Tensor[int64, scalar])")
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads  # the caller's, untouched
    # the second time: from the cache, at once
    assert config.dataloader_kwargs(images, batch_size=16) == {"num_workers": 0, "pin_memory": False,
                                                                "batch_size": 16}
    assert config.dataloader_report(images, batch_size=16) == report
    assert config.dataloader_report(images, batch_size=16, force=True, budget_s=BUDGET_S).wall_s != report.wall_s


def test_a_costly_transform_makes_the_loop_without_workers_data_bound(tiny_family: str) -> None:
    dataset = Blurred()
    report = hand_config(tiny_family).dataloader_report(dataset, batch_size=8, budget_s=BUDGET_S)
    without = report.trials[0]
    assert without.num_workers == 0 and without.data_wait_share is not None and without.data_wait_share > 0.5
    assert not keeps_up(without, report.step_ms or 0.0)
    # so workers were measured with it, and the answer is the decision on what was measured
    assert report.trials[1].num_workers >= 1
    chosen = choose(report.trials, report.step_ms or 0.0)
    assert chosen is not None and (report.num_workers, report.prefetch_factor) == (chosen.num_workers,
                                                                                    chosen.prefetch_factor)
    assert "per training step, the step alone" in report.reason
    assert ("; without workers" in report.reason) == (report.num_workers > 0)
    kwargs = hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=8)
    if kwargs["num_workers"]:
        assert kwargs["persistent_workers"] is True and kwargs["prefetch_factor"] in (2, 4)
    labels = torch.cat([labels for _, labels in DataLoader(dataset, **kwargs)])
    assert labels.tolist() == [i % 4 for i in range(len(dataset))]  # every sample once, in order


def test_the_fixed_arguments_are_measured_with_and_returned_as_given(tiny_family: str) -> None:
    dataset = Blurred(length=64, passes=1)
    kwargs = hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=8, num_workers=0, shuffle=True,
                                                    drop_last=True)
    assert kwargs == {"num_workers": 0, "pin_memory": False, "batch_size": 8, "shuffle": True, "drop_last": True}
    report = hand_config(tiny_family).dataloader_report(dataset, batch_size=8, num_workers=0, shuffle=True,
                                                    drop_last=True)
    assert {t.num_workers for t in report.trials} == {0}
    # a new version of the data, named by the caller's key, is another question
    assert hand_config(tiny_family).dataloader_report(dataset, batch_size=8, key="v2", num_workers=0, shuffle=True,
                                                  drop_last=True).wall_s != report.wall_s


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: a process's share is all of it")
def test_in_a_job_each_process_loads_with_its_share_of_the_cores(tiny_family: str) -> None:
    cores = len(os.sched_getaffinity(0))
    # as many processes as cores on this machine (torchrun --nproc-per-node): each has one core for its workers
    config = hand_config(tiny_family).model_copy(update={"ranks": Ranks(rank=1, local_rank=1, world_size=cores,
                                                                      local_world_size=cores)})
    report = config.dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)  # data-bound without workers: workers were tried
    assert [t.num_workers for t in report.trials][:2] == [0, 1]  # the most is the process's share, not every core
    assert max(t.num_workers for t in report.trials) == 1 and {t.num_threads for t in report.trials} == {1}


def test_in_a_container_held_to_2_cpus_of_96_the_most_workers_are_2(tiny_family: str,
                                                                      container: Callable[..., Path]) -> None:
    container(cpus=96, **{"cpu.max": "200000 100000\n"})  # docker run --cpus=2 on a 96-core host
    report = hand_config(tiny_family).dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)  # data-bound without workers: workers were tried
    assert [t.num_workers for t in report.trials][:2] == [0, 2]  # the most: the quota's, not the affinity's 96
    assert max(t.num_workers for t in report.trials) == 2


def test_the_most_workers_fit_in_half_the_memory_available(tiny_family: str, container: Callable[..., Path],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 96 cores and no CPU quota, but a memory limit with 3 GiB to spare, and this process holding 1 GiB of its own:
    # a worker counts as much, and the workers get half the 3 GiB
    container(cpus=96, **{"memory.max": f"{3 * 2**30}\n", "memory.current": "0\n"})
    status = tmp_path / "status"
    status.write_text(Path("/proc/self/status").read_text().replace("RssAnon:", "Old:") + "RssAnon:\t1048576 kB\n")
    monkeypatch.setattr(_linux, "_STATUS", str(status))
    report = hand_config(tiny_family).dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)
    assert [t.num_workers for t in report.trials][:2] == [0, 1] and max(t.num_workers for t in report.trials) == 1


@pytest.mark.parametrize(("arguments", "named"), [
    ({"batch_size": 0}, "batch_size=0"),
    ({"batch_size": 8, "num_worker": 2}, "num_worker=2 is invalid: expected a DataLoader keyword"),
    ({"batch_size": 8, "num_workers": -1}, "num_workers=-1"),
    ({"batch_size": 8, "key": 3}, "key=3"),
    ({"batch_size": 4, "batch_sampler": BatchSampler(SequentialSampler(range(8)), 4, False), "shuffle": True},
     "shuffle=True is invalid: expected no shuffle beside batch_sampler=, whose batches are the loader's"),
], ids=["batch-size", "unknown-keyword", "negative-workers", "key", "shuffle-beside-a-batch-sampler"])
def test_bad_arguments_are_named(tiny_family: str, arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        hand_config(tiny_family).dataloader_kwargs(Blurred(length=8), **arguments)


def test_a_dataset_whose_sample_size_changes_from_run_to_run_is_answered_from_the_cache(tiny_family: str,
                                                                                         tmp_path: Path) -> None:
    dataset, config = Rescaled(tmp_path / "reads"), hand_config(tiny_family)
    report = config.dataloader_report(dataset, batch_size=8, num_workers=0, budget_s=BUDGET_S)
    assert report.dataset == "test_loader.Rescaled of 32 samples, each Tensor[float32, 9]"  # the first read's size
    reads = dataset.reads
    assert config.dataloader_report(dataset, batch_size=8, num_workers=0) == report
    assert dataset.reads == reads + 1  # read once more, another size


@pytest.mark.parametrize(("make", "make_other"), [
    (lambda: functools.partial(shifted, by=1.0), lambda: functools.partial(shifted, by=2.0)),
    (Stacked, Summed),
], ids=["partials", "callable-instances"])
def test_collate_functions_are_told_apart_by_what_they_are(tiny_family: str, make: Callable[[], Any],
                                                           make_other: Callable[[], Any]) -> None:
    dataset, config = Vectors(), hand_config(tiny_family)

    def measured(collate_fn: Any) -> LoaderReport:
        return config.dataloader_report(dataset, batch_size=8, num_workers=0, collate_fn=collate_fn,
                                        budget_s=BUDGET_S)

    first = measured(make())
    assert measured(make()) == first  # another object, the same function: from the cache
    assert measured(make_other()).wall_s != first.wall_s  # another function: measured


def test_a_batch_sampler_makes_the_batches_and_is_returned_without_a_batch_size(tiny_family: str) -> None:
    dataset = Vectors(length=30)
    batches = BatchSampler(SequentialSampler(dataset), batch_size=7, drop_last=False)
    # batch_size: the batches' usual size, the training step's; DataLoader takes the batch sampler's instead
    kwargs = hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=7, batch_sampler=batches)
    assert "batch_size" not in kwargs and kwargs["batch_sampler"] is batches
    assert [len(batch) for batch in DataLoader(dataset, **kwargs)] == [7, 7, 7, 7, 2]


def _trial(workers: int, loop_ms: float | None, share: float = 0.0, prefetch: int | None = None) -> LoaderTrial:
    return LoaderTrial(num_workers=workers, prefetch_factor=prefetch, loop_ms=loop_ms, data_wait_share=share,
                       failure=None if loop_ms is not None else "DataLoader worker (pid(s) 1) exited unexpectedly")


def test_the_cheapest_setting_that_keeps_up_wins_else_the_fastest() -> None:
    step_ms = 10.0
    # without workers the loop's own steps are the reference: 9% of it waiting for data keeps up, 10% does not
    assert keeps_up(_trial(0, 20.0, share=0.09), step_ms) and not keeps_up(_trial(0, 20.0, share=0.1), step_ms)
    # with workers the step alone is: they may slow the training's own step
    assert keeps_up(_trial(2, step_ms * (1 + KEEP_UP)), step_ms) and not keeps_up(_trial(2, 11.5), step_ms)
    assert choose([_trial(0, 30.0, 0.6), _trial(4, 10.2), _trial(2, 10.9), _trial(1, 12.0)], step_ms) == \
        _trial(2, 10.9)
    assert choose([_trial(0, 30.0, 0.6), _trial(2, 14.0, prefetch=4), _trial(2, 13.0), _trial(1, None)], step_ms) == \
        _trial(2, 13.0)
    assert choose([_trial(2, 12.0, prefetch=4), _trial(2, 10.5)], step_ms) == _trial(2, 10.5)
    assert choose([_trial(1, None), _trial(2, None)], step_ms) is None


def test_the_step_time_is_the_recorded_one_at_the_loaders_batch_size(tiny_family: str, tmp_path: Path) -> None:
    assert step_at(40.0, 64, 32) == 20.0 and step_at(40.0, None, 32) == 40.0 and step_at(None, 64, 32) is None
    assert get_family("tiny_mlp").default_batch_size() == 64 and get_family(tiny_family).default_batch_size() is None
    report = hand_config("tiny_mlp", step_ms=8.0).dataloader_report(Vectors(), batch_size=16, num_workers=0,
                                                                  budget_s=BUDGET_S)
    assert report.step_ms == 2.0  # 8 ms at tiny_mlp's batch of 64, a quarter of it
    assert re.search(r"; measured in \d+\.\d s \(budget 1 s\)$", report.reason), report.reason


def test_without_a_recorded_step_time_the_loader_is_measured_alone(tiny_family: str) -> None:
    report = hand_config(tiny_family, step_ms=None).dataloader_report(Blurred(length=64), batch_size=8,
                                                                   budget_s=BUDGET_S)
    assert report.step_ms is None and "per batch, the loader alone: this config has no step time recorded" in \
        report.reason
    assert report.num_workers == min((t for t in report.trials if t.loop_ms is not None),
                                     key=lambda t: t.loop_ms or 0.0).num_workers  # the fastest
