"""``cfg.dataloader_kwargs`` where loading fails, caused and not faked: a lambda under spawn, a dataset defined in
``__main__``, a raise on item 7, workers that exit or hang, a daemonic process; each is named with its cause, and
nothing is kept.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_for_tests import BUDGET_S, Blurred, hand_config
from torch.utils.data import (
    Dataset,
    IterableDataset,
    TensorDataset,
    get_worker_info,
)

from autotune import Config, ConfigurationError, DatasetError, LoaderReport
from autotune._cache import loader_answers
from autotune._tools.loader import keeps_up, workers_failed


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


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.randn(8, 4))


class NoLength(Dataset[torch.Tensor]):
    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(4)


def _answers_kept() -> list[str]:
    return sorted(p.name for p in loader_answers.FILES.directory().glob("*.json"))


def test_a_dataset_spawned_workers_cannot_receive_gets_none_with_the_cause_and_is_not_kept(
        tiny_family: str, spawned: None, caplog: pytest.LogCaptureFixture) -> None:
    report = hand_config(tiny_family).dataloader_report(WithLambda(), batch_size=8, budget_s=BUDGET_S)
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
        hand_config(tiny_family).dataloader_report(WithLambda(), batch_size=8, num_workers=2, budget_s=BUDGET_S)


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
                          text=True, timeout=300, cwd=Path(__file__).parents[1], env=os.environ)
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
    config = hand_config(tiny_family).model_copy(update={"device": "cuda:0"})
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
                                                         args=(hand_config(tiny_family), Blurred(length=64), reports))
    daemon.start()
    report = LoaderReport.model_validate_json(reports.get(timeout=120))
    daemon.join()
    assert report.num_workers == 0 and workers_failed(report.trials)
    assert "daemonic processes are not allowed to have children" in report.reason
    assert _answers_kept() == []


def test_a_dataset_that_raises_surfaces_with_context_and_nothing_is_cached(tiny_family: str) -> None:
    with pytest.raises(DatasetError) as raised:
        hand_config(tiny_family).dataloader_report(BrokenAt7(), batch_size=4, budget_s=BUDGET_S)
    assert str(raised.value) == ("cannot measure loading test_loader_failures.BrokenAt7: loading batch 2 at "
                                 "num_workers=0 raised ValueError: item 7 is corrupt; nothing was cached")
    assert isinstance(raised.value.__cause__, ValueError)
    assert _answers_kept() == []


@pytest.mark.parametrize(("dataset", "why"), [
    (TensorDataset(torch.zeros(0, 4)), r"it is empty \(len 0\)"),
    (NoLength(), "it has no len()"),
    (Stream(), "it is an IterableDataset"),
], ids=["empty", "no-len", "iterable"])
def test_a_dataset_that_cannot_be_measured_is_a_clear_error(tiny_family: str, dataset: Any, why: str) -> None:
    with pytest.raises(DatasetError, match=why):
        hand_config(tiny_family).dataloader_kwargs(dataset, batch_size=4)
    assert _answers_kept() == []


def test_a_setting_whose_workers_exit_is_ruled_out_and_the_answer_without_them_not_kept(tiny_family: str) -> None:
    report = hand_config(tiny_family).dataloader_report(WorkersExit(), batch_size=8, budget_s=BUDGET_S)
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
        hand_config(tiny_family).dataloader_report(WorkersHang(), batch_size=8, num_workers=1, timeout=1,
                                               budget_s=BUDGET_S)
    assert _answers_kept() == []
