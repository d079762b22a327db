"""Training runs under the guard for the guard's tests: a measured record with a known pick, a classifier whose
fp16 overflows on cue, a least-squares run that diverges on cue, and the demotions as stored.

The measured record the guard's Config comes from is hand-made (``samples``): which precision wins on this CPU is
not the subject, and each test needs a known pick to demote.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from families_for_tests import build_tiny
from samples import family, timed
from torch import nn

import autotune
from autotune import Config, ConfigMisbehaved
from autotune._cache import lookup as _cached
from autotune._records import Demotion

TODAY = dt.datetime.now(dt.timezone.utc).date().isoformat()


def measured_config(kind: str, pick: str) -> Config:
    """Store a record of ``kind`` in which ``pick`` wins (fp16 then bf16 next, bf16 then fp32), and answer from it."""
    step_ms = {"fp16-mixed": {"fp16-mixed": 50.0, "bf16-mixed": 70.0, "fp32": 100.0},
               "bf16-mixed": {"bf16-mixed": 60.0, "fp32": 100.0, "fp16-mixed": 300.0}}[pick]
    record = family(kind, *(timed("cpu", precision, ms) for precision, ms in step_ms.items()))
    _cached.store().save(autotune.fingerprint(), record)
    config = autotune.best_config(kind)
    assert config.precision == pick and "demoted" not in config.reason
    return config


def classifier_loss(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    features, labels, weight = batch[:3]
    return F.cross_entropy(model(features), labels) * weight


def classifier(config: Config, steps: int, *, overflow_at: Collection[int] = (), huge_inputs_at: Collection[int] = (),
                loss_weight: float = 1.0, model: nn.Module | None = None, lr_from_100: float | None = None,
                guard: autotune.Guard | None = None, images_mb: int = 0, clip: float | None = None,
                lr_factor: Callable[[int], float] | None = None) -> tuple[autotune.Guard, int]:
    """Train the tiny family's own model (or ``model``) under a guard that can replay; at ``overflow_at`` steps the
    loss is weighted 1e6, doubling with each step from the first (to 2**30 times it: its fp16 gradients overflow
    faster than GradScaler's halving catches up, fp32's stay finite), at ``huge_inputs_at`` the inputs are 1e5 times
    larger (fp16 activations overflow: NaN loss); from step 100 the learning rate is ``lr_from_100``; each batch also
    carries ``images_mb`` MiB the loss does not use; the gradients' norm is clipped to ``clip``; a LambdaLR scheduler
    multiplies the learning rate by ``lr_factor``. Returns the guard and the steps GradScaler skipped."""
    model = model if model is not None else build_tiny().model
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = guard if guard is not None else config.guard(model, optimizer, loss_fn=classifier_loss)
    scaler = config.grad_scaler()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor) if lr_factor is not None else None
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    images = torch.zeros(images_mb * 2**18)
    skipped = 0
    for step in range(1, steps + 1):
        if step == 100 and lr_from_100 is not None:
            optimizer.param_groups[0]["lr"] = lr_from_100
        batch = (features * (1e5 if step in huge_inputs_at else 1.0), labels,
                 1e6 * 2.0 ** min(step - min(overflow_at), 30) if step in overflow_at else loss_weight, images)
        with config.autocast():
            loss = classifier_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        before = scaler.get_scale() if scaler.is_enabled() else 0.0
        scaler.step(optimizer)
        scaler.update()
        if scheduler is not None:
            scheduler.step()
        skipped += scaler.is_enabled() and scaler.get_scale() < before
        guard.step(loss, scaler, batch=batch)
    guard.check()
    return guard, skipped


def demote_fp16(kind: str) -> Demotion:
    """fp16 wins the record of ``kind``; a real run's activations overflow fp16 and fp32's do not: demoted."""
    config = measured_config(kind, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50))
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "configuration"
    return guard.finding


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, targets = batch
    return F.mse_loss(model(features).float(), targets)


def regression(config: Config, steps: int, *, lr_from_300: float) -> autotune.Guard:
    """Full-batch least squares (Hessian 2I): SGD converges at lr 0.05; from step 300 ``lr_from_300``, past 1.0
    the error grows a little at each step (slow divergence, in any precision), just under 1.0 it stays bounded."""
    torch.manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(256, 8))
    features = basis * 16
    targets = features @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
    model = nn.Linear(8, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = config.guard(model, optimizer, loss_fn=mse)
    for step in range(1, steps + 1):
        if step == 300:
            optimizer.param_groups[0]["lr"] = lr_from_300
        with config.autocast():
            loss = mse(model, (features, targets))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        guard.step(loss, batch=(features, targets))
    guard.check()
    return guard


def stored_demotions(cache: Path) -> dict[str, list[dict[str, object]]]:
    document = json.loads((cache / "demotions" / f"{autotune.fingerprint().digest}.json").read_text())
    return document["demotions"]  # type: ignore[no-any-return]


def demoted_answer(kind: str, was: str, seen: str, step: int, now: str) -> Config:
    config = autotune.best_config(kind)
    assert config.reason == f"{was} was demoted after {seen} at step {step:,} of training on {TODAY}; using {now}"
    assert len(config.reason) < 160 and config.precision == now
    return config
