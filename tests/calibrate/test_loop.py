"""The loop end to end in the guard: ``guard.data(loader)`` times each wait for a batch of a real DataLoader around a
real training step on the CPU. Where a test needs a known wait, the dataset sleeps: the sleep is the controlled
quantity the guard's accounting is checked against, measured by the dataset itself."""

from __future__ import annotations

import json
import logging
import math
import time

import pytest
import torch
import torch.nn.functional as F
from samples import family, timed
from torch import nn
from torch.utils.data import DataLoader, Dataset

import autotune
from autotune import Config
from autotune._cache import lookup as _cached
from autotune._cache import loops
from autotune._cli import main
from autotune._guard.watch import DATA_WAIT_SHARE, DATA_WAIT_WINDOWS


class Sleepy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """64 samples of 8 features that each take ``sleep_s`` to load; ``loaded_s`` sums what loading took."""

    def __init__(self, sleep_s: float, length: int = 64) -> None:
        self.sleep_s = sleep_s
        self.length = length
        self.loaded_s = 0.0
        generator = torch.Generator().manual_seed(0)
        self.features = torch.randn(length, 8, generator=generator)
        self.labels = torch.randint(0, 4, (length,), generator=generator)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.perf_counter()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.loaded_s += time.perf_counter() - started
        return self.features[index], self.labels[index]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    """The training step on one thread: on a busy machine two threads of a tiny step wait for each other, and the
    step, not the data, would be all the loop's time (the conftest puts the count back)."""
    torch.set_num_threads(1)


def _config(kind: str) -> Config:
    measured = family(kind, timed("cpu", "bf16-mixed", 4.0), timed("cpu", "fp32", 8.0))
    _cached.store().save(autotune.fingerprint(), measured)
    return autotune.best_config(kind)


def _train(guard: autotune.Guard, loader: DataLoader[tuple[torch.Tensor, torch.Tensor]], *,
           step_sleep_s: float = 0.0) -> float:
    """One pass of a real training loop over ``loader``; returns its wall time, from asking for the first batch to
    the end of the last step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    started = ended = time.perf_counter()
    for features, labels in guard.data(loader):
        loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step_sleep_s:
            time.sleep(step_sleep_s)  # a step of a known length beside the real one
        guard.step(loss)
        ended = time.perf_counter()
    return ended - started


@pytest.mark.parametrize("sleep_s", [0.0, 0.001, 0.004], ids=["in-memory", "1ms-per-sample", "4ms-per-sample"])
def test_the_data_wait_share_is_the_loops_controlled_wait(tiny_family: str, sleep_s: float) -> None:
    guard = _config(tiny_family).guard()
    dataset = Sleepy(sleep_s)
    wall_s = _train(guard, DataLoader(dataset, batch_size=4), step_sleep_s=0.02)
    summary = guard.summary()
    assert summary.steps == summary.batches == 16
    assert summary.data_wait_share is not None and summary.data_ms is not None and summary.step_ms is not None
    # what the dataset itself spent loading, over the loop's wall time: the wait's floor (collating adds to it)
    assert abs(summary.data_wait_share - dataset.loaded_s / wall_s) <= 0.10
    assert (summary.data_ms + summary.step_ms) * summary.batches / 1000 == pytest.approx(wall_s, rel=0.10)
    assert summary.measured_step_ms == pytest.approx(4.0, rel=0.05)


def test_a_data_bound_loop_is_told_once_what_to_try(tiny_family: str, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(tiny_family)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4,
                           step_ms=config.step_ms, speedup=2.0)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        _train(guard, DataLoader(Sleepy(0.005, length=96), batch_size=2))
    told = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(told) == 1, told
    assert f"over the last {DATA_WAIT_WINDOWS * 4} steps" in told[0]
    assert "the step is 2.0x faster than fp32 but the loop is data-bound" in told[0]
    assert "cfg.dataloader_kwargs(dataset, batch_size=...)" in told[0]
    summary = guard.summary()
    assert summary.data_wait_share is not None and summary.data_wait_share > DATA_WAIT_SHARE


def test_a_loop_that_keeps_up_is_not_told(tiny_family: str, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(tiny_family)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        _train(guard, DataLoader(Sleepy(0.0, length=96), batch_size=2), step_sleep_s=0.01)
    assert not [r for r in caplog.records if "waited for data" in r.getMessage()]


def test_each_run_keeps_its_loop_latest_first_and_bounded(tiny_family: str) -> None:
    config = _config(tiny_family)
    first = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    for _ in range(2):  # two epochs of one run: one entry, updated
        _train(first, DataLoader(Sleepy(0.0), batch_size=8))
    (kept,) = loops.of(config.fingerprint_digest, tiny_family)
    assert kept.batches == 16 and kept.started_at == first.started_at
    runs = [autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
            for _ in range(loops.KEPT_PER_FAMILY + 1)]
    for guard in runs:
        _train(guard, DataLoader(Sleepy(0.0), batch_size=8))
    kept_now = loops.of(config.fingerprint_digest, tiny_family)
    assert [s.started_at for s in kept_now] == [g.started_at for g in reversed(runs)][:loops.KEPT_PER_FAMILY]


def test_a_loop_left_early_and_a_short_one(tiny_family: str) -> None:
    config = _config(tiny_family)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    for count, _ in enumerate(guard.data(DataLoader(Sleepy(0.0), batch_size=2)), start=1):
        if count == 6:
            break  # the sixth batch's step never ends: five are counted
    assert guard.summary().batches == 5
    assert [s.batches for s in loops.of(config.fingerprint_digest, tiny_family)] == [5]
    short = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=50)
    _train(short, DataLoader(Sleepy(0.0), batch_size=8))
    assert short.check() is None
    assert len(loops.of(config.fingerprint_digest, tiny_family)) == 1  # 8 batches, under one read: not kept


def test_a_guard_without_data_sums_up_nothing(tiny_family: str) -> None:
    guard = _config(tiny_family).guard()
    guard.step(torch.tensor(1.0))
    summary = guard.summary()
    assert (summary.steps, summary.batches, summary.data_wait_share, summary.data_ms) == (1, 0, None, None)


def test_explain_shows_what_training_saw_beside_the_measured_step(tiny_family: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tiny_family)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4, step_ms=4.0)
    _train(guard, DataLoader(Sleepy(0.002), batch_size=4))
    assert main(["--explain", tiny_family]) == 0
    explained = capsys.readouterr().out
    share = guard.summary().data_wait_share
    assert share is not None
    assert (f"in training on {guard.summary().at[:10]} (cpu bf16-mixed, 16 steps): {share:.0%} waiting for data; "
            "per training step") in explained
    assert "(4 ms measured)" in explained


def test_clear_cache_forgets_the_loops(tiny_family: str) -> None:
    config = _config(tiny_family)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    _train(guard, DataLoader(Sleepy(0.0), batch_size=8))
    assert loops.of(config.fingerprint_digest, tiny_family)
    autotune.clear_cache()
    assert loops.of(config.fingerprint_digest, tiny_family) == []


def test_the_loops_file_is_strict_json_with_what_an_older_writer_left_in_it(tiny_family: str) -> None:
    """Another family's entry holding a bare NaN (as json.dumps writes it) is written back as the string records
    use: every parser reads the file."""
    config = _config(tiny_family)
    older = autotune.Guard("other", config.candidate, config.fingerprint_digest, step_ms=float("nan")).summary()
    target = loops.path(config.fingerprint_digest)
    target.parent.mkdir(parents=True, mode=0o700)
    target.write_text(json.dumps({"schema_version": loops.SCHEMA_VERSION,
                                  "loops": {"other": [older.model_dump(mode="json")]}}))
    assert "NaN" in target.read_text()
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    _train(guard, DataLoader(Sleepy(0.0), batch_size=8))

    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant}")

    document = json.loads(target.read_text(), parse_constant=refuse)
    assert document["loops"]["other"][0]["measured_step_ms"] == "NaN"
    assert [s.model_kind for s in loops.of(config.fingerprint_digest, tiny_family)] == [tiny_family]
    (kept,) = loops.of(config.fingerprint_digest, "other")
    assert kept.measured_step_ms is not None and math.isnan(kept.measured_step_ms)
