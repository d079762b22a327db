"""What measuring a DataLoader leaves in this process (random streams, generators, samplers, torch's flags, the
samples it read itself), read back from the process, and how each setting is timed (waves of its workers, a larger
batch where the budget's is too slow). A wait (a read from a slow disk) is the per-sample cost.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import torch
from loader_for_tests import BUDGET_S, Blurred, Vectors, hand_config
from torch.utils.data import (
    Dataset,
    RandomSampler,
    SequentialSampler,
)


class Logged(Dataset[tuple[torch.Tensor, int]]):
    """Samples that wait ``wait_s`` each, as reads from a slow disk do, and log who read which (``pid index`` lines,
    appended to ``log``: whichever process reads) and what each read drew from torch's, Python's and NumPy's
    random streams (an augmentation's draws)."""

    def __init__(self, log: Path, length: int = 512, wait_s: float = 0.0) -> None:
        self.log = log
        self.length = length
        self.wait_s = wait_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with self.log.open("a") as log:
            log.write(f"{os.getpid()} {index}\n")
        time.sleep(self.wait_s)
        noise = torch.rand(()) + random.random() + float(numpy.random.rand())
        return torch.full((8,), float(index)) + noise * 0, index % 4

    def reads(self) -> list[tuple[int, int]]:
        """(pid, index) of every read, in order."""
        if not self.log.exists():
            return []
        return [(int(pid), int(index)) for pid, index in (line.split() for line in self.log.read_text().split("\n")
                                                           if line)]


@pytest.mark.parametrize("start", ["default", "spawn"])
def test_the_callers_random_streams_are_not_drawn_from(tiny_family: str, tmp_path: Path, start: str,
                                                       request: pytest.FixtureRequest) -> None:
    """Each sample draws from torch's, Python's and NumPy's streams, as an augmentation does: without workers the
    measurement reads samples itself, in a forked process where workers fork, else here (spawn) with the streams put
    back."""
    if start == "spawn":
        request.getfixturevalue("spawned")
    torch.manual_seed(1), random.seed(1), numpy.random.seed(1)
    before = torch.get_rng_state(), random.getstate(), numpy.random.get_state()
    report = hand_config(tiny_family).dataloader_report(Logged(tmp_path / "log"), batch_size=8, num_workers=0,
                                                    shuffle=True, budget_s=BUDGET_S)
    readers = {pid for pid, _ in Logged(tmp_path / "log").reads()}
    assert report.trials and readers  # samples were read, and drew: under spawn, here
    assert (os.getpid() in readers) == (start == "spawn")
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    state = numpy.random.get_state()
    assert all(numpy.array_equal(now, then) for now, then in zip(state, before[2], strict=True))


def test_the_callers_generator_and_sampler_are_not_advanced(tiny_family: str) -> None:
    dataset = Vectors(length=64)

    class Counted(SequentialSampler):
        """A sampler with state of its own: the epochs it began."""

        epochs = 0

        def __iter__(self) -> Iterator[int]:
            self.epochs += 1
            return super().__iter__()

    shuffling = torch.Generator().manual_seed(3)
    state = shuffling.get_state()
    kwargs = hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=8, shuffle=True, generator=shuffling)
    assert kwargs["generator"] is shuffling and torch.equal(shuffling.get_state(), state)  # returned as given, unused
    drawing = torch.Generator().manual_seed(4)
    state = drawing.get_state()
    sampler = RandomSampler(dataset, generator=drawing)
    assert hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=8, sampler=sampler)["sampler"] is sampler
    assert torch.equal(drawing.get_state(), state)
    counted = Counted(dataset)
    report = hand_config(tiny_family).dataloader_report(dataset, batch_size=8, sampler=counted, budget_s=BUDGET_S)
    assert report.trials and counted.epochs == 0


@pytest.mark.parametrize("benchmark", [False, True])
def test_torchs_settings_are_left_as_they_were(tiny_family: str, benchmark: bool) -> None:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        hand_config(tiny_family).dataloader_report(Blurred(length=64), batch_size=8, budget_s=BUDGET_S)
        assert torch.backends.cudnn.benchmark is benchmark
    finally:
        torch.backends.cudnn.benchmark = before


@pytest.mark.skipif(multiprocessing.get_all_start_methods()[0] != "fork", reason="workers fork by default on Linux")
def test_where_workers_are_measured_this_process_reads_no_sample(tiny_family: str, tmp_path: Path) -> None:
    """A dataset that opens a file at its first read (HDF5, LMDB) must not open it in the process that forks the
    workers: neither the first sample (the question's key) nor the loop without workers is read here."""
    dataset = Logged(tmp_path / "log", wait_s=0.002)
    report = hand_config(tiny_family).dataloader_report(dataset, batch_size=8, budget_s=BUDGET_S)
    assert report.trials[0].num_workers == 0 and any(t.num_workers and t.loop_ms for t in report.trials)
    readers = {pid for pid, _ in dataset.reads()}
    assert readers and os.getpid() not in readers
    # from the cache: the first sample read again for the key, elsewhere again
    assert hand_config(tiny_family).dataloader_report(dataset, batch_size=8) == report
    assert os.getpid() not in {pid for pid, _ in dataset.reads()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the most workers are one")
def test_each_setting_is_timed_over_two_waves_of_its_workers_reading_on(tiny_family: str, tmp_path: Path) -> None:
    """Samples that wait 5 ms each, 4 a batch, with 2 workers: each worker's first batch warms up, then at least two
    more of each worker's are timed (the window holds whole waves, however slow a batch), and each setting reads
    samples no other setting read (the page cache flatters none)."""
    dataset = Logged(tmp_path / "log", length=2048, wait_s=0.005)
    report = hand_config(tiny_family).dataloader_report(dataset, batch_size=4, num_workers=2, budget_s=0.3)
    assert {t.num_workers for t in report.trials} == {2}
    assert all(t.batches >= 2 + 2 * 2 for t in report.trials)
    indices = [index for _, index in dataset.reads()[1:]]  # after the first sample, read for the question's key
    assert len(indices) == len(set(indices))
    alone = hand_config(tiny_family).dataloader_report(Logged(tmp_path / "alone", length=2048, wait_s=0.005),
                                                   batch_size=4, num_workers=0, budget_s=0.3)
    assert alone.trials[0].batches >= 3  # the first, then two timed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the most workers are one")
def test_batches_too_slow_for_the_budget_state_a_larger_one_before_the_workers_are_timed(
        tiny_family: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Batches of 0.2 s against a budget of 0.5 s: two periods of the most workers' wave cannot fit, so once the
    loop without workers has told how slow a batch is, the budget grows to what they need, the log says so, and the
    reason states the larger budget beside what the measurement cost."""
    dataset = Logged(tmp_path / "log", length=64, wait_s=0.1)
    with caplog.at_level(logging.INFO, logger="autotune"):
        report = hand_config(tiny_family).dataloader_report(dataset, batch_size=2, budget_s=0.5)
    assert report.budget_s >= 2 and report.budget_s == int(report.budget_s)
    assert any(t.num_workers and t.loop_ms for t in report.trials)
    assert [r.message for r in caplog.records if "measuring DataLoader settings for about" in r.message] == [
        f"measuring DataLoader settings for about {report.budget_s:g} s, not 0.5: batches this slow need that long "
        "for two periods of the workers' wave"]
    assert report.reason.endswith(f"(budget {report.budget_s:g} s)")
