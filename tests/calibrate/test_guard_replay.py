"""The guard's replay, on real training runs on the CPU: what it leaves as it was, its limits (memory, time, an
optimizer it cannot copy), and the loops it follows (clipping, gradient accumulation, a scheduler's learning rate).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from families_for_tests import build_tiny
from guard_for_tests import (
    classifier,
    classifier_loss,
    measured_config,
)
from torch import nn

import autotune
from autotune import ConfigMisbehaved
from autotune._cache import demotions


def test_the_replay_leaves_the_runs_model_and_random_state_as_they_were(tiny_family: str) -> None:
    """A run whose finding is replayed ends where the same run under a guard that cannot replay ends."""
    config = measured_config(tiny_family, "fp16-mixed")
    ends = []
    for replays in (True, False):
        model = build_tiny().model
        guard = None if replays else config.guard()
        with pytest.warns(ConfigMisbehaved, match="it is demoted" if replays else "Not replayed"):
            found, _ = classifier(config, 60, huge_inputs_at=range(10, 60), model=model, guard=guard)
        assert found.finding is not None and found.finding.step == 10
        ends.append(([p.detach().clone() for p in model.parameters()], torch.get_rng_state()))
    (replayed, rng_replayed), (plain, rng_plain) = ends
    assert all(torch.equal(a, b) for a, b in zip(replayed, plain, strict=True))
    assert torch.equal(rng_replayed, rng_plain)


def test_a_zero_optimizer_is_said_once_and_guard_step_never_raises(
    tiny_family: str, isolated_autotune: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ZeroRedundancyOptimizer's state_dict() raises until a collective gathers it: no state to replay from.
    from torch import distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    config = measured_config(tiny_family, "fp16-mixed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = build_tiny().model
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        guard = config.guard(model, optimizer, loss_fn=classifier_loss)
        scaler = config.grad_scaler()
        features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
        with pytest.warns(ConfigMisbehaved, match="ZeroRedundancyOptimizer.*so nothing is demoted"):
            for step in range(1, 51):
                batch = (features * (1e5 if step >= 10 else 1.0), labels, 1.0)
                with config.autocast():
                    loss = classifier_loss(model, batch)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                guard.step(loss, scaler, batch=batch)
    finally:
        dist.destroy_process_group()
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "unreplayed"
    assert sum("keeps no state to replay from" in r.getMessage() for r in caplog.records) == 1
    assert not (isolated_autotune / "demotions").exists() and autotune.best_config(tiny_family) == config


def test_a_state_over_a_quarter_of_the_available_memory_is_not_kept_and_demotes_nothing(
    tiny_family: str, isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autotune.backends import _linux

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(_linux, "available_bytes", lambda: 4096)  # /proc/meminfo's MemAvailable: 4 KiB
    config = measured_config(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"Not replayed: .*state \(0.00\d+ MiB\) is more than 25% of the host "
                      r"memory available \(0.0039\d MiB\)"):
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50))
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "unreplayed"
    assert sum("keeps no state to replay from" in r.getMessage() for r in caplog.records) == 1
    assert not (isolated_autotune / "demotions").exists()


def _slow_in_fp32(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    """The loss; three seconds a step where autocast is off (the replay's fp32 reference), NaN where it is on and the
    batch is marked (the run's bf16)."""
    features, labels, marked = batch
    autocast = torch.is_autocast_enabled("cpu")
    if not autocast:
        time.sleep(3.0)
    loss = F.cross_entropy(model(features), labels)
    return loss + float("nan") if marked and autocast else loss


def test_a_replay_past_its_time_limit_stops_and_demotes_nothing(tiny_family: str, isolated_autotune: Path) -> None:
    # The replay's reference takes three seconds a step, far over 25 times the run's (a few ms): it stops at its limit.
    config = measured_config(tiny_family, "bf16-mixed")
    model = build_tiny().model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, model=model, optimizer=optimizer,
                           loss_fn=_slow_in_fp32, read_every=10)  # a few batches to replay: a short test
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    with pytest.warns(ConfigMisbehaved, match=r"Not replayed: the replay stopped at its time limit, [\d.]+ s \(25 "
                      r"times the run's step time per replayed step\), in cpu fp32 at replayed step \d+ of \d+"):
        for step in range(1, 31):
            batch = (features, labels, step >= 25)
            with config.autocast():
                loss = _slow_in_fp32(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            guard.step(loss, batch=batch)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "unreplayed"
    assert not (isolated_autotune / "demotions").exists()


@pytest.mark.parametrize("clip", [None, 1.0], ids=["gradscaler-only", "clipped"])
def test_a_loop_that_clips_is_said_and_demoted_only_on_fp32s_own_weights(
    tiny_family: str, isolated_autotune: Path, clip: float | None
) -> None:
    # fp16's activations overflow from step 10 and fp32's do not. The replay steps on the backward pass's gradients:
    # a clipping loop it cannot reproduce, so fp16 is judged on fp32's own weights, batch by batch; GradScaler's
    # unscaling alone is no change to the gradients.
    config = measured_config(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match="it is demoted") as warned:
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50), clip=clip)
    replay = guard.finding.replay if guard.finding is not None else None
    assert replay is not None and replay.blame == "configuration"
    said = str(next(w.message for w in warned if isinstance(w.message, ConfigMisbehaved)))
    if clip is None:
        assert replay.detail == "" and "own weights" not in said
    else:
        assert replay.detail == ("the loop changes the gradients between the backward pass and the optimizer's step "
                                 "(clipping, or DistributedDataParallel's average over the ranks), which the replay "
                                 "does not: fp16-mixed was judged on fp32's own weights, batch by batch")
        assert f"and fp32 does not ({replay.detail}): it is demoted" in said
    assert len(demotions.of(config.fingerprint_digest, tiny_family)) == 1


def _nan_in_mixed(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    """The loss; NaN where the batch is marked and autocast is on (the run's bf16), not in fp32. Its gradients stay
    finite."""
    features, labels, marked = batch
    loss = F.cross_entropy(model(features), labels)
    return loss + float("nan") if marked and torch.is_autocast_enabled("cpu") else loss


def test_a_loop_that_accumulates_gradients_is_said_and_demoted_only_on_fp32s_own_weights(
    tiny_family: str, isolated_autotune: Path
) -> None:
    # Four micro-batches per optimizer step, guard.step on each: the replay steps on every batch, so it says so and
    # judges bf16 on fp32's weights; bf16's loss is NaN from step 40 on, fp32's is not.
    config = measured_config(tiny_family, "bf16-mixed")
    model = build_tiny().model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = config.guard(model, optimizer, loss_fn=_nan_in_mixed)
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    with pytest.warns(ConfigMisbehaved, match=r"accumulates gradients over 4 backward passes per optimizer step, "
                      r"which the replay does not: bf16-mixed was judged on fp32's own weights.*it is demoted"):
        for step in range(1, 101):
            batch = (features[step % 4 * 16:step % 4 * 16 + 16], labels[step % 4 * 16:step % 4 * 16 + 16], step >= 40)
            with config.autocast():
                loss = _nan_in_mixed(model, batch)
            (loss / 4).backward()
            if step % 4 == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            guard.step(loss, batch=batch)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "configuration"
    assert len(demotions.of(config.fingerprint_digest, tiny_family)) == 1


def test_the_replay_follows_a_schedulers_learning_rate_step_by_step(tiny_family: str, isolated_autotune: Path) -> None:
    # The scheduler sets lr 1e6 for steps 100-119 (the weights blow up, in any precision), then 1e-2 again: a replay
    # at the learning rate of the finding's read would see nothing; at the run's own, fp32 misbehaves too.
    config = measured_config(tiny_family, "bf16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"fp32 misbehaves too .*nothing is demoted"):
        guard, _ = classifier(config, 200, lr_factor=lambda done: 1e8 if 99 <= done < 119 else 1.0)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "training" and guard.finding.replay.detail == ""
    assert guard.finding.step < 150 and not (isolated_autotune / "demotions").exists()
