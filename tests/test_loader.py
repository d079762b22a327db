"""``cfg.dataloader_kwargs``: real datasets, real DataLoaders with real worker processes, the config's recorded step
time spent on the CPU. The per-sample cost that makes a loop data-bound is a real transform (a blur of a small image)
or a wait (a read from a slow disk); failures are caused (a lambda under spawn, a raise on item 7, a worker that exits
or hangs), not faked; what the measurement leaves in this process (random streams, generators, samplers, torch's
flags, the samples it read itself) is read back from the process.

Which setting is fastest on this machine is the benchmark's to show (``benchmarks/loader.py``); the tests assert
what does not depend on the machine's speed: the shape of the answer, the decision on its own measurements, and
every bad input's clear answer.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    get_worker_info,
)

import autotune
from autotune import Config, ConfigurationError, DatasetError, LoaderReport, LoaderTrial
from autotune._cache import loader_answers
from autotune._families import get_family
from autotune._records import Ranks
from autotune._tools.loader import KEEP_UP, choose, keeps_up, step_at, workers_failed
from autotune.backends import _linux

#: a small budget: each setting's loop is timed over a tenth of it
BUDGET_S = 1.0


def _config(kind: str, step_ms: float | None = 1.0) -> Config:
    """A measured answer made by hand: fp32 on one CPU thread (which precision wins is not the subject), a step of
    ``step_ms`` at the family's own batch."""
    return Config(model_kind=kind, device="cpu", precision="fp32", num_threads=1, source="measured",
                  reason="measured by hand", fingerprint_digest=autotune.fingerprint().digest, step_ms=step_ms)


class Blurred(Dataset[tuple[torch.Tensor, int]]):
    """Seeded 3x32x32 images, each blurred by ``passes`` 5x5 box filters when loaded: a real per-sample CPU cost,
    about a millisecond per pass on one core."""

    def __init__(self, length: int = 256, passes: int = 6) -> None:
        self.length = length
        self.passes = passes
        self.kernel = torch.ones(3, 1, 5, 5) / 25

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(index))
        for _ in range(self.passes):
            image = F.conv2d(image, self.kernel, padding=2, groups=3)
        return image[0], index % 4


class WithLambda(Blurred):
    """A blur, then a transform held as a lambda: fine under fork, unpicklable for a spawned worker."""

    def __init__(self) -> None:
        super().__init__()
        self.transform: Callable[[torch.Tensor], torch.Tensor] = lambda x: x * 2

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = super().__getitem__(index)
        return self.transform(image), label


class BrokenAt7(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 7:
            raise ValueError("item 7 is corrupt")
        return torch.full((8,), float(index))


class WorkersExit(Blurred):
    """Loads in the main process; a worker process exits at its first sample (a library that quits)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None:
            os._exit(7)
        return super().__getitem__(index)


class WorkersHang(Blurred):
    """A worker goes silent for 2 s at its first sample (a network filesystem that stalls), then goes on."""

    stalled = False

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None and not self.stalled:
            self.stalled = True  # in this worker's copy of the dataset
            time.sleep(2)
        return super().__getitem__(index)


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


class Vectors(Dataset[torch.Tensor]):
    def __init__(self, length: int = 32) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((8,), float(index))


def shifted(batch: list[torch.Tensor], by: float = 0.0) -> torch.Tensor:
    return torch.stack(batch) + by


class Stacked:
    def __call__(self, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch)


class Summed:
    def __call__(self, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(batch).sum(dim=1)


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.randn(8, 4))


class NoLength(Dataset[torch.Tensor]):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(4)


@pytest.fixture
def spawned() -> Iterator[None]:
    """Worker processes started by spawn, as on macOS and Windows (or under CUDA): the dataset is pickled."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def _answers_kept() -> list[str]:
    return sorted(p.name for p in loader_answers.FILES.directory().glob("*.json"))


def test_in_memory_tensors_need_no_workers_and_the_answer_is_cached() -> None:
    images = TensorDataset(torch.randn(256, 3, 64, 64), torch.randint(0, 10, (256,)))
    config = _config("cnn", step_ms=40.0)  # a small CNN's step on a CPU core, at its batch of 32
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
    report = _config(tiny_family).dataloader_report(dataset, batch_size=8, budget_s=BUDGET_S)
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
    kwargs = _config(tiny_family).dataloader_kwargs(dataset, batch_size=8)
    if kwargs["num_workers"]:
        assert kwargs["persistent_workers"] is True and kwargs["prefetch_factor"] in (2, 4)
    labels = torch.cat([labels for _, labels in DataLoader(dataset, **kwargs)])
    assert labels.tolist() == [i % 4 for i in range(len(dataset))]  # every sample once, in order


def test_the_fixed_arguments_are_measured_with_and_returned_as_given(tiny_family: str) -> None:
    dataset = Blurred(length=64, passes=1)
    kwargs = _config(tiny_family).dataloader_kwargs(dataset, batch_size=8, num_workers=0, shuffle=True,
                                                    drop_last=True)
    assert kwargs == {"num_workers": 0, "pin_memory": False, "batch_size": 8, "shuffle": True, "drop_last": True}
    report = _config(tiny_family).dataloader_report(dataset, batch_size=8, num_workers=0, shuffle=True,
                                                    drop_last=True)
    assert {t.num_workers for t in report.trials} == {0}
    # a new version of the data, named by the caller's key, is another question
    assert _config(tiny_family).dataloader_report(dataset, batch_size=8, key="v2", num_workers=0, shuffle=True,
                                                  drop_last=True).wall_s != report.wall_s


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: a process's share is all of it")
def test_in_a_job_each_process_loads_with_its_share_of_the_cores(tiny_family: str) -> None:
    cores = len(os.sched_getaffinity(0))
    # as many processes as cores on this machine (torchrun --nproc-per-node): each has one core for its workers
    config = _config(tiny_family).model_copy(update={"ranks": Ranks(rank=1, local_rank=1, world_size=cores,
                                                                      local_world_size=cores)})
    report = config.dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)  # data-bound without workers: workers were tried
    assert [t.num_workers for t in report.trials][:2] == [0, 1]  # the most is the process's share, not every core
    assert max(t.num_workers for t in report.trials) == 1 and {t.num_threads for t in report.trials} == {1}


def test_in_a_container_held_to_2_cpus_of_96_the_most_workers_are_2(tiny_family: str,
                                                                      container: Callable[..., Path]) -> None:
    container(cpus=96, **{"cpu.max": "200000 100000\n"})  # docker run --cpus=2 on a 96-core host
    report = _config(tiny_family).dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
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
    report = _config(tiny_family).dataloader_report(Blurred(), batch_size=8, budget_s=BUDGET_S)
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)
    assert [t.num_workers for t in report.trials][:2] == [0, 1] and max(t.num_workers for t in report.trials) == 1


def test_a_dataset_spawned_workers_cannot_receive_gets_none_with_the_cause_and_is_not_kept(
        tiny_family: str, spawned: None, caplog: pytest.LogCaptureFixture) -> None:
    report = _config(tiny_family).dataloader_report(WithLambda(), batch_size=8, budget_s=BUDGET_S)
    # the loop without workers is data-bound, so the workers were tried, and could not be started with it
    assert report.num_workers == 0 and report.start_method == "spawn"
    assert not keeps_up(report.trials[0], report.step_ms or 0.0)
    (tried,) = [t for t in report.trials if t.num_workers]
    assert tried.loop_ms is None and tried.failure is not None and workers_failed(report.trials)
    assert tried.failure.startswith("worker processes started by spawn cannot receive the dataset (")
    assert "<lambda>" in tried.failure and tried.failure.endswith("define its class and what it holds in a module "
                                                                  "they can import, no lambdas or nested functions")
    assert "no setting with workers could run, so this answer is not kept" in report.reason
    assert tried.failure in report.reason
    assert report.reason in caplog.text and "WARNING" in caplog.text
    # not kept as the best: once the dataset is fixed its workers are measured, not a stored num_workers=0
    assert _answers_kept() == []
    with pytest.raises(DatasetError, match="the fixed arguments need workers, and worker processes started by spawn "
                       "cannot receive the dataset"):
        _config(tiny_family).dataloader_report(WithLambda(), batch_size=8, num_workers=2, budget_s=BUDGET_S)


#: A program run as ``python -c``, as a notebook runs one: its dataset is defined in ``__main__``, which a spawned
#: worker cannot import, and holds a lambda (with ``lambda``), which cannot be pickled to one. Each sample waits 5 ms,
#: as a read from a network disk does: workers wait side by side, so they make the loop faster however busy the
#: machine. Arguments: the Config's device, the start method the program sets ("default": none), "lambda" or not.
_MAIN_PROGRAM = textwrap.dedent("""
    import multiprocessing, sys, time
    import torch
    from torch.utils.data import Dataset
    import autotune

    class Reads(Dataset):
        def __init__(self, transform):
            self.transform = transform

        def __len__(self):
            return 128

        def __getitem__(self, index):
            time.sleep(0.005)
            return self.transform(torch.full((8,), float(index))), index % 4

    device, start_method, transform = sys.argv[1], sys.argv[2], sys.argv[3]
    if start_method != "default":
        multiprocessing.set_start_method(start_method)
    config = autotune.Config(model_kind="tiny_mlp", device=device, precision="fp32", num_threads=1,
                             source="measured", reason="by hand", fingerprint_digest=autotune.fingerprint().digest)
    dataset = Reads(lambda x: x * 2) if transform == "lambda" else Reads(torch.clone)
    print(config.dataloader_report(dataset, batch_size=8, budget_s=1.0).model_dump_json())
""")


def _run_main_program(device: str, start_method: str, transform: str) -> tuple[LoaderReport, str]:
    """The report the program printed, and what it wrote on stderr."""
    done = subprocess.run([sys.executable, "-c", _MAIN_PROGRAM, device, start_method, transform], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent, env=os.environ)
    assert done.returncode == 0, done.stderr
    return LoaderReport.model_validate_json(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.skipif(multiprocessing.get_all_start_methods()[0] != "fork" or len(os.sched_getaffinity(0)) < 2,
                    reason="workers fork by default on Linux before Python 3.14; one core allows one worker, which "
                    "cannot load faster than the loop without workers")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_a_dataset_defined_in_main_with_a_lambda_gets_workers_started_as_the_users_loader_starts_them(
        device: str) -> None:
    """On Linux the user's DataLoader forks its workers, whatever device trains (forked workers in a process that
    trains on CUDA are PyTorch's normal case), and a forked worker has the dataset as it is: so do the measured
    ones, and no start method of the measurement's own is passed to the user."""
    report, _ = _run_main_program(device, "default", "lambda")
    assert report.start_method == "fork"
    assert all(t.failure is None and t.loop_ms is not None for t in report.trials)
    assert report.num_workers > 0
    assert "multiprocessing_context" not in report.tuned()


@pytest.mark.skipif(torch.cuda.is_available(), reason="here the CUDA config is measured: the test above")
def test_a_config_for_a_device_this_process_cannot_use_is_named(tiny_family: str) -> None:
    """The loop is measured copying its batches to the Config's device: without it, the error says so (torch's own,
    on a build without CUDA, is an AssertionError)."""
    config = _config(tiny_family).model_copy(update={"device": "cuda:0"})
    with pytest.raises(ConfigurationError, match=r"device='cuda:0' is invalid: cuda:0 is not usable \(.*\); this "
                       "process can use: cpu; the DataLoader is measured copying its batches to this Config's "
                       "device: ask on the machine that trains"):
        config.dataloader_report(Blurred(length=16), batch_size=8, budget_s=BUDGET_S)
    assert _answers_kept() == []


def test_workers_that_die_receiving_a_dataset_defined_in_main_are_its_cause_not_a_kept_answer() -> None:
    """Where workers are spawned (macOS, Windows, a program that chose spawn), a class defined in ``__main__`` of
    ``python -c`` or a notebook does not exist in them: they die before their first batch, DataLoader says only
    that they exited, and the cause is found by receiving the dataset in one process started the same way."""
    report, stderr = _run_main_program("cpu", "spawn", "clone")
    assert report.num_workers == 0 and report.start_method == "spawn" and workers_failed(report.trials)
    (died,) = [t for t in report.trials if t.num_workers]
    assert died.failure == ("worker processes started by spawn cannot receive the dataset (AttributeError: Can't get "
                            "attribute 'Reads' on <module '__main__' (built-in)>): define its class and what it holds "
                            "in a module they can import, no lambdas or nested functions")
    assert report.reason.startswith("num_workers=0 with 1 training thread: no setting with workers could run, so "
                                    "this answer is not kept (")
    assert report.reason in stderr  # a WARNING, on Python's last-resort handler where the app configured no logging
    assert _answers_kept() == []


def _report_in(config: Config, dataset: Any, reports: Any) -> None:
    torch.set_num_threads(1)  # forked: the parent's OpenMP threads are not here
    reports.put(config.dataloader_report(dataset, batch_size=8, budget_s=BUDGET_S).model_dump_json())


@pytest.mark.skipif(multiprocessing.get_all_start_methods()[0] != "fork", reason="a forked daemon: Linux's default")
def test_in_a_daemonic_process_workers_are_ruled_out_with_the_cause(tiny_family: str) -> None:
    """A daemonic process (a multiprocessing Pool's) may start no processes: neither its DataLoader's workers nor the
    one the measurement reads the first sample in, which it then reads in that process."""
    reports = multiprocessing.get_context("fork").Queue()
    daemon = multiprocessing.get_context("fork").Process(target=_report_in, daemon=True,
                                                         args=(_config(tiny_family), Blurred(length=64), reports))
    daemon.start()
    report = LoaderReport.model_validate_json(reports.get(timeout=120))
    daemon.join()
    assert report.num_workers == 0 and workers_failed(report.trials)
    assert "daemonic processes are not allowed to have children" in report.reason
    assert _answers_kept() == []


def test_a_dataset_that_raises_surfaces_with_context_and_nothing_is_cached(tiny_family: str) -> None:
    with pytest.raises(DatasetError) as raised:
        _config(tiny_family).dataloader_report(BrokenAt7(), batch_size=4, budget_s=BUDGET_S)
    assert str(raised.value) == ("cannot measure loading test_loader.BrokenAt7: loading batch 2 at num_workers=0 "
                                 "raised ValueError: item 7 is corrupt; nothing was cached")
    assert isinstance(raised.value.__cause__, ValueError)
    assert _answers_kept() == []


@pytest.mark.parametrize(("dataset", "why"), [
    (TensorDataset(torch.zeros(0, 4)), r"it is empty \(len 0\)"),
    (NoLength(), "it has no len()"),
    (Stream(), "it is an IterableDataset"),
], ids=["empty", "no-len", "iterable"])
def test_a_dataset_that_cannot_be_measured_is_a_clear_error(tiny_family: str, dataset: Any, why: str) -> None:
    with pytest.raises(DatasetError, match=why):
        _config(tiny_family).dataloader_kwargs(dataset, batch_size=4)
    assert _answers_kept() == []


def test_a_setting_whose_workers_exit_is_ruled_out_and_the_answer_without_them_not_kept(tiny_family: str) -> None:
    report = _config(tiny_family).dataloader_report(WorkersExit(), batch_size=8, budget_s=BUDGET_S)
    assert report.num_workers == 0
    ruled_out = [t for t in report.trials if t.failure is not None]
    assert ruled_out and all(t.num_workers > 0 and "exited unexpectedly" in (t.failure or "")
                             and (t.failure or "").endswith("; its own error, if any, is on stderr") for t in ruled_out)
    assert "no setting with workers could run, so this answer is not kept" in report.reason
    assert f"num_workers={ruled_out[0].num_workers}: DataLoader worker (pid" in report.reason
    assert _answers_kept() == []


def test_a_setting_whose_workers_hang_is_ruled_out_after_the_timeout(tiny_family: str) -> None:
    with pytest.raises(DatasetError, match="every setting was ruled out: num_workers=1: DataLoader timed out after 1 "
                       "seconds"):
        _config(tiny_family).dataloader_report(WorkersHang(), batch_size=8, num_workers=1, timeout=1,
                                               budget_s=BUDGET_S)
    assert _answers_kept() == []


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
        _config(tiny_family).dataloader_kwargs(Blurred(length=8), **arguments)


def test_a_dataset_whose_sample_size_changes_from_run_to_run_is_answered_from_the_cache(tiny_family: str,
                                                                                         tmp_path: Path) -> None:
    dataset, config = Rescaled(tmp_path / "reads"), _config(tiny_family)
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
    dataset, config = Vectors(), _config(tiny_family)

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
    kwargs = _config(tiny_family).dataloader_kwargs(dataset, batch_size=7, batch_sampler=batches)
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
    report = _config("tiny_mlp", step_ms=8.0).dataloader_report(Vectors(), batch_size=16, num_workers=0,
                                                                  budget_s=BUDGET_S)
    assert report.step_ms == 2.0  # 8 ms at tiny_mlp's batch of 64, a quarter of it
    assert re.search(r"; measured in \d+\.\d s \(budget 1 s\)$", report.reason), report.reason


def test_without_a_recorded_step_time_the_loader_is_measured_alone(tiny_family: str) -> None:
    report = _config(tiny_family, step_ms=None).dataloader_report(Blurred(length=64), batch_size=8,
                                                                   budget_s=BUDGET_S)
    assert report.step_ms is None and "per batch, the loader alone: this config has no step time recorded" in \
        report.reason
    assert report.num_workers == min((t for t in report.trials if t.loop_ms is not None),
                                     key=lambda t: t.loop_ms or 0.0).num_workers  # the fastest


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
    report = _config(tiny_family).dataloader_report(Logged(tmp_path / "log"), batch_size=8, num_workers=0,
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
    kwargs = _config(tiny_family).dataloader_kwargs(dataset, batch_size=8, shuffle=True, generator=shuffling)
    assert kwargs["generator"] is shuffling and torch.equal(shuffling.get_state(), state)  # returned as given, unused
    drawing = torch.Generator().manual_seed(4)
    state = drawing.get_state()
    sampler = RandomSampler(dataset, generator=drawing)
    assert _config(tiny_family).dataloader_kwargs(dataset, batch_size=8, sampler=sampler)["sampler"] is sampler
    assert torch.equal(drawing.get_state(), state)
    counted = Counted(dataset)
    report = _config(tiny_family).dataloader_report(dataset, batch_size=8, sampler=counted, budget_s=BUDGET_S)
    assert report.trials and counted.epochs == 0


@pytest.mark.parametrize("benchmark", [False, True])
def test_torchs_settings_are_left_as_they_were(tiny_family: str, benchmark: bool) -> None:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        _config(tiny_family).dataloader_report(Blurred(length=64), batch_size=8, budget_s=BUDGET_S)
        assert torch.backends.cudnn.benchmark is benchmark
    finally:
        torch.backends.cudnn.benchmark = before


@pytest.mark.skipif(multiprocessing.get_all_start_methods()[0] != "fork", reason="workers fork by default on Linux")
def test_where_workers_are_measured_this_process_reads_no_sample(tiny_family: str, tmp_path: Path) -> None:
    """A dataset that opens a file at its first read (HDF5, LMDB) must not open it in the process that forks the
    workers: neither the first sample (the question's key) nor the loop without workers is read here."""
    dataset = Logged(tmp_path / "log", wait_s=0.002)
    report = _config(tiny_family).dataloader_report(dataset, batch_size=8, budget_s=BUDGET_S)
    assert report.trials[0].num_workers == 0 and any(t.num_workers and t.loop_ms for t in report.trials)
    readers = {pid for pid, _ in dataset.reads()}
    assert readers and os.getpid() not in readers
    # from the cache: the first sample read again for the key, elsewhere again
    assert _config(tiny_family).dataloader_report(dataset, batch_size=8) == report
    assert os.getpid() not in {pid for pid, _ in dataset.reads()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the most workers are one")
def test_each_setting_is_timed_over_two_waves_of_its_workers_reading_on(tiny_family: str, tmp_path: Path) -> None:
    """Samples that wait 5 ms each, 4 a batch, with 2 workers: each worker's first batch warms up, then at least two
    more of each worker's are timed (the window holds whole waves, however slow a batch), and each setting reads
    samples no other setting read (the page cache flatters none)."""
    dataset = Logged(tmp_path / "log", length=2048, wait_s=0.005)
    report = _config(tiny_family).dataloader_report(dataset, batch_size=4, num_workers=2, budget_s=0.3)
    assert {t.num_workers for t in report.trials} == {2}
    assert all(t.batches >= 2 + 2 * 2 for t in report.trials)
    indices = [index for _, index in dataset.reads()[1:]]  # after the first sample, read for the question's key
    assert len(indices) == len(set(indices))
    alone = _config(tiny_family).dataloader_report(Logged(tmp_path / "alone", length=2048, wait_s=0.005),
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
        report = _config(tiny_family).dataloader_report(dataset, batch_size=2, budget_s=0.5)
    assert report.budget_s >= 2 and report.budget_s == int(report.budget_s)
    assert any(t.num_workers and t.loop_ms for t in report.trials)
    assert [r.message for r in caplog.records if "measuring DataLoader settings for about" in r.message] == [
        f"measuring DataLoader settings for about {report.budget_s:g} s, not 0.5: batches this slow need that long "
        "for two periods of the workers' wave"]
    assert report.reason.endswith(f"(budget {report.budget_s:g} s)")
