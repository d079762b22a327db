"""The guard in the training loop, on real training runs on the CPU: real models, real autocast, torch's own
GradScaler ("cpu"), the real cache, the real replay. What goes wrong is caused, not faked: gradients that overflow
fp16 from step N, activations that overflow fp16 (NaN losses), a learning rate past the stability limit (slow
divergence, or a blow-up to NaN in any precision).

The measured record the guard's Config comes from is hand-made (``samples``): which precision wins on this CPU is
not the subject, and each test needs a known pick to demote.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from families_for_tests import build_tiny
from samples import family, timed
from torch import nn
from torch.utils.data import TensorDataset

import autotune
from autotune import Config, ConfigMisbehaved, _answer
from autotune._cache import demotions, loader_answers
from autotune._cache import lookup as _cached
from autotune._cli import main
from autotune._guard.watch import NON_FINITE_LOSSES, SKIPPED_STEPS, model_signature
from autotune._records import Candidate, Demotion, Drop, Interval

TODAY = dt.datetime.now(dt.timezone.utc).date().isoformat()


def _measured(kind: str, pick: str) -> Config:
    """Store a record of ``kind`` in which ``pick`` wins (fp16 then bf16 next, bf16 then fp32), and answer from it."""
    step_ms = {"fp16-mixed": {"fp16-mixed": 50.0, "bf16-mixed": 70.0, "fp32": 100.0},
               "bf16-mixed": {"bf16-mixed": 60.0, "fp32": 100.0, "fp16-mixed": 300.0}}[pick]
    record = family(kind, *(timed("cpu", precision, ms) for precision, ms in step_ms.items()))
    _cached.store().save(autotune.fingerprint(), record)
    config = autotune.best_config(kind)
    assert config.precision == pick and "demoted" not in config.reason
    return config


def _loss(model: nn.Module, batch: tuple[Any, ...]) -> torch.Tensor:
    features, labels, weight = batch[:3]
    return F.cross_entropy(model(features), labels) * weight


def _classifier(config: Config, steps: int, *, overflow_at: Collection[int] = (), huge_inputs_at: Collection[int] = (),
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
    guard = guard if guard is not None else config.guard(model, optimizer, loss_fn=_loss)
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
            loss = _loss(model, batch)
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


def _demote_fp16(kind: str) -> Demotion:
    """fp16 wins the record of ``kind``; a real run's activations overflow fp16 and fp32's do not: demoted."""
    config = _measured(kind, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50))
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "configuration"
    return guard.finding


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, targets = batch
    return F.mse_loss(model(features).float(), targets)


def _regression(config: Config, steps: int, *, lr_from_300: float) -> autotune.Guard:
    """Full-batch least squares (Hessian 2I): SGD converges at lr 0.05; from step 300 ``lr_from_300``, past 1.0
    the error grows a little at each step (slow divergence, in any precision), just under 1.0 it stays bounded."""
    torch.manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(256, 8))
    features = basis * 16
    targets = features @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
    model = nn.Linear(8, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = config.guard(model, optimizer, loss_fn=_mse)
    for step in range(1, steps + 1):
        if step == 300:
            optimizer.param_groups[0]["lr"] = lr_from_300
        with config.autocast():
            loss = _mse(model, (features, targets))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        guard.step(loss, batch=(features, targets))
    guard.check()
    return guard


def _stored(cache: Path) -> dict[str, list[dict[str, object]]]:
    document = json.loads((cache / "demotions" / f"{autotune.fingerprint().digest}.json").read_text())
    return document["demotions"]  # type: ignore[no-any-return]


def _demoted_answer(kind: str, was: str, seen: str, step: int, now: str) -> Config:
    config = autotune.best_config(kind)
    assert config.reason == f"{was} was demoted after {seen} at step {step:,} of training on {TODAY}; using {now}"
    assert len(config.reason) < 160 and config.precision == now
    return config


def test_fp16_gradients_overflowing_from_step_n_demote_fp16(tiny_family: str, isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"tiny on cpu fp16-mixed misbehaved at step 120: GradScaler skipped 25 "
                      r"optimizer steps in a row and did not recover.*Replayed from step \d+ "
                      r"on the \d+ batches since, fp16-mixed misbehaves again \(at replayed step \d+\) and fp32 does "
                      r"not.*--forget-demotion tiny"):
        guard, skipped = _classifier(config, 200, overflow_at=range(120, 200))
    # Which snapshot it replays from depends on how long snapshots took (wall time); from any, the replay
    # misbehaves at the step the run did.
    replay = guard.finding.replay if guard.finding is not None else None
    assert replay is not None and replay.from_step is not None and replay.run_at is not None
    assert replay.from_step + replay.run_at == 120
    assert skipped >= 10  # the scale kept halving, as GradScaler does
    assert guard.finding is not None and guard.finding.seen == "skipped_steps" and guard.finding.step == 120
    assert guard.finding.evidence == sorted(guard.finding.evidence, reverse=True)  # the scale at each skip, halving
    [stored] = _stored(isolated_autotune)[tiny_family]
    assert (stored["seen"], stored["step"], stored["candidate"], stored["model"], stored["family_model"]) == (
        "skipped_steps", 120, {"device": "cpu", "precision": "fp16-mixed", "memory_format": "contiguous",
                               "optimizer": "default", "num_threads": None, "compiled": False},
        model_signature(build_tiny().model), True)
    assert stored["replay"]["blame"] == "configuration"  # type: ignore[index]
    answer = _demoted_answer(tiny_family, "fp16-mixed", "skipped optimizer steps", 120, "bf16-mixed")
    assert guard.fallback() == answer
    assert answer.evidence is not None and answer.evidence.demotions == [guard.finding]


def test_nan_losses_from_step_n_demote(tiny_family: str, isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step 150: 3 non-finite losses within 100 steps "
                      r"\(steps 150, 151, 152; the last finite one"):
        guard, _ = _classifier(config, 200, huge_inputs_at=range(150, 200))
    assert guard.finding is not None and guard.finding.seen == "non_finite" and guard.finding.step == 150
    assert _stored(isolated_autotune)[tiny_family][0]["detail"] == guard.finding.detail
    _demoted_answer(tiny_family, "fp16-mixed", "NaN losses", 150, "bf16-mixed")


def test_calibrate_reports_the_answer_best_config_gives_after_a_demotion(tiny_family: str) -> None:
    # One answer path: the report's Config for a family leaves out what training demoted here, as best_config does.
    _demote_fp16(tiny_family)
    report = autotune.calibrate([tiny_family])  # the stored record answers: nothing is measured again
    assert report.configs[tiny_family] == autotune.best_config(tiny_family)
    assert report.configs[tiny_family].precision == "bf16-mixed" and "demoted" in report.configs[tiny_family].reason


def test_the_guard_a_config_makes_is_an_autotune_guard_and_answers_again_with_best_config(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard()
    assert isinstance(guard, autotune.Guard)
    assert guard.fallback() == config


def test_a_guard_made_by_hand_answers_again_with_the_function_it_is_given(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    by_hand = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, answer=autotune.best_config)
    assert by_hand.fallback() == config
    given = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest,
                           answer=lambda kind, **options: autotune.best_config(kind, **{**options, "prefer": "cpu"}))
    assert given.fallback() == autotune.best_config(tiny_family, prefer="cpu")


def test_a_guard_made_by_hand_without_an_answer_watches_and_says_what_to_pass_at_fallback(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, read_every=4)
    for loss in (1.0, 0.9, 0.8, 0.7):
        guard.step(torch.tensor(loss))
    assert guard.check() is None and guard.steps == 4
    with pytest.raises(autotune.ConfigurationError, match=r"pass answer=autotune\.best_config, or make the guard "
                       r"with cfg\.guard\(\)") as raised:
        guard.fallback()
    assert (raised.value.variable, raised.value.value) == ("answer", None)


def test_a_loop_through_guard_data_keeps_its_batches_for_the_replay(tiny_family: str) -> None:
    """Inside ``for batch in guard.data(loader):`` guard.step needs no batch=: the replay trains on the loader's."""
    config = _measured(tiny_family, "fp16-mixed")
    model = build_tiny().model
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = config.guard(model, optimizer, loss_fn=_loss)
    scaler = config.grad_scaler()
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    loader = [(features * (1e5 if step >= 10 else 1.0), labels, 1.0) for step in range(1, 51)]
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        for batch in guard.data(loader):
            with config.autocast():
                loss = _loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            guard.step(loss, scaler)
        guard.check()
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "configuration" and guard.finding.replay.steps


@pytest.mark.parametrize("pick", ["bf16-mixed", "fp16-mixed"])
def test_a_learning_rate_blow_up_is_the_training_and_demotes_nothing(
    tiny_family: str, isolated_autotune: Path, pick: str
) -> None:
    """lr 1e6 from step 100: the weights blow up and the losses turn NaN, in fp32 as in the run's precision."""
    config = _measured(tiny_family, pick)
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step 1\d\d: 3 non-finite losses.*fp32 misbehaves too "
                      r"\(at replayed step \d+\): it is the training, not the configuration, so nothing is demoted: "
                      r"look at the learning rate"):
        guard, _ = _classifier(config, 200, lr_from_100=1e6)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "training" and guard.finding.replay.reference_at is not None
    assert not (isolated_autotune / "demotions").exists()
    assert autotune.best_config(tiny_family) == config and guard.fallback() == config


def test_a_slow_divergence_from_a_learning_rate_past_its_limit_demotes_nothing(
    tiny_family: str, isolated_autotune: Path
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step \d+: the loss rose from its floor.*fp32 "
                      "misbehaves too.*nothing is demoted"):
        guard = _regression(config, 800, lr_from_300=1.005)
    finding = guard.finding
    assert finding is not None and finding.seen == "diverged"
    # It began after the change, and was found while the loss was finite: a slow rise, blocks of 50 steps.
    assert 301 <= finding.step <= 601 and (finding.step - 1) % 50 == 0
    assert all(value < 1e6 for value in finding.evidence)
    assert not (isolated_autotune / "demotions").exists()


def test_a_loss_that_rises_less_than_half_its_progress_is_no_divergence(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard = _regression(config, 800, lr_from_300=0.99)
    assert guard.finding is None and autotune.best_config(tiny_family).precision == "bf16-mixed"


def test_a_healthy_run_with_gradscalers_first_back_offs_finds_nothing(tiny_family: str,
                                                                       isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    assert config.grad_scaler().get_scale() == 65536.0  # GradScaler's default: too high for these gradients
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard, skipped = _classifier(config, 300, loss_weight=100.0)
    assert skipped >= 3  # the early back-off happened ...
    assert guard.finding is None  # ... and is not a finding
    assert not (isolated_autotune / "demotions").exists()
    assert autotune.best_config(tiny_family) == config


@pytest.mark.parametrize(("bad_steps", "found"), [
    pytest.param([100, 150], False, id="two-in-100-steps"),
    pytest.param([100, 150, 250], False, id="three-but-not-within-100-steps"),
    pytest.param([100, 150, 180], True, id="three-within-100-steps"),
])
def test_non_finite_losses_that_gradscaler_handles_are_no_finding_until_three_in_a_window(
    tiny_family: str, bad_steps: list[int], found: bool
) -> None:
    assert NON_FINITE_LOSSES == 3
    config = _measured(tiny_family, "fp16-mixed")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        guard, _ = _classifier(config, 300, huge_inputs_at=bad_steps)
    assert len(seen) == found
    assert (guard.finding.step if guard.finding else None) == (100 if found else None)
    assert ("demoted" in autotune.best_config(tiny_family).reason) == found


@pytest.mark.parametrize(("skips", "found"), [
    pytest.param(SKIPPED_STEPS - 1, False, id="three-skips"), pytest.param(SKIPPED_STEPS, True, id="four-skips"),
])
def test_back_offs_after_the_scale_settles_are_a_finding_from_four_in_100_steps(
    tiny_family: str, skips: int, found: bool
) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    overflow_at = range(100, 100 + 20 * skips, 20)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        guard, skipped = _classifier(config, 250, overflow_at=overflow_at)
    assert skipped >= skips
    assert len(seen) == found and (guard.finding is not None) == found


def test_a_gradscaler_back_off_after_a_spike_it_recovers_from_is_no_finding(
    tiny_family: str, isolated_autotune: Path
) -> None:
    # Four steps in a row whose fp16 gradients overflow: GradScaler skips them, halving its scale, and goes on.
    config = _measured(tiny_family, "fp16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard, skipped = _classifier(config, 250, overflow_at=range(150, 150 + SKIPPED_STEPS))
    assert skipped >= SKIPPED_STEPS and guard.finding is None
    assert not (isolated_autotune / "demotions").exists()


def test_a_finding_whose_batches_are_gone_is_not_reproduced_and_demotes_nothing(
    tiny_family: str, isolated_autotune: Path
) -> None:
    """Batches of 4 MiB: the guard keeps the last 31 (128 MiB in all); the three that overflowed (steps 10-12) are
    older."""
    config = _measured(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"Replayed from step 1 on the last 31 of the 49 batches since, "
                      r"neither fp16-mixed nor fp32 misbehaves: the batches that did are gone, so nothing is demoted"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 13), images_mb=4)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "not_reproduced"
    assert not (isolated_autotune / "demotions").exists()


def test_one_apps_model_cannot_demote_another_apps(tiny_family: str) -> None:
    """A wider model than the family builds overflows fp16: the demotion holds for it, not for the family's own."""
    config = _measured(tiny_family, "fp16-mixed")
    wider = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    with pytest.warns(ConfigMisbehaved, match="it is demoted on this machine for this model"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50), model=wider)
    assert guard.finding is not None and not guard.finding.family_model
    assert autotune.best_config(tiny_family) == config  # the family's own model: not demoted
    for answer in (autotune.best_config(tiny_family, model=wider), guard.fallback()):
        assert answer.precision == "bf16-mixed" and answer.reason.startswith("fp16-mixed was demoted")
    same_shapes = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))  # another instance: the same model
    assert autotune.best_config(tiny_family, model=same_shapes).precision == "bf16-mixed"
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        autotune.best_config(tiny_family, model="wider")  # type: ignore[arg-type]


def test_a_demotion_an_older_autotune_recorded_holds_for_the_familys_own_model(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    demotions.record(config.fingerprint_digest, Demotion(
        model_kind=tiny_family, candidate=config.candidate, seen="non_finite", step=10, detail="3 NaN losses",
        evidence=[math.nan], at=TODAY, autotune_version="0.1.0"))
    assert autotune.best_config(tiny_family).precision == "fp32"
    assert autotune.best_config(tiny_family, model=nn.Linear(8, 4)).precision == "bf16-mixed"


def test_fp32_on_the_cpu_is_reported_never_demoted(tiny_family: str, isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "bf16-mixed").model_copy(update={"precision": "fp32"})
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match="fp32 on the CPU is the reference.*nothing is demoted"):
        for _ in range(10):
            guard.step(torch.tensor(float("nan")))
        guard.check()
    assert guard.finding is not None and not (isolated_autotune / "demotions").exists()


def test_a_guard_without_the_model_warns_and_demotes_nothing_saying_why(
    tiny_family: str, isolated_autotune: Path
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard(on_failure="raise")
    with pytest.raises(ConfigMisbehaved, match=r"at step 7: 3 non-finite.*Not replayed: the guard was made without "
                       r"the model, its optimizer and a loss function.*cfg.guard\(model, optimizer, loss_fn=...\)"
                       r"\), so nothing is demoted") as raised:
        for step in range(1, 51):
            guard.step(torch.tensor(1.0 if step < 7 else float("inf")))
    assert raised.value.step == 7 and not raised.value.demoted
    assert isinstance(raised.value, autotune.AutotuneError)
    assert not (isolated_autotune / "demotions").exists() and autotune.best_config(tiny_family) == config


@pytest.mark.parametrize(("given", "missing"), [
    pytest.param({"model": nn.Linear(8, 4)}, "optimizer, loss_fn", id="model-alone"),
    pytest.param({"loss_fn": _loss}, "model, optimizer", id="loss-alone"),
])
def test_a_guard_given_part_of_what_a_replay_needs_says_what_is_missing(
    tiny_family: str, given: dict[str, Any], missing: str
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    with pytest.raises(TypeError, match=f"{missing} missing"):
        config.guard(**given)


def test_a_loss_of_more_than_one_value_is_refused_with_what_to_pass(tiny_family: str) -> None:
    guard = _measured(tiny_family, "bf16-mixed").guard()
    with pytest.raises(ValueError, match=r"shape \(4,\): pass the loss you call backward\(\) on"):
        guard.step(torch.ones(4))
    guard.step(torch.ones(1))  # DataParallel's (1,)-shaped loss is one value


def test_a_finding_is_one_warning_not_also_a_log_line(
    tiny_family: str, caplog: pytest.LogCaptureFixture
) -> None:
    guard = _measured(tiny_family, "bf16-mixed").guard()
    with caplog.at_level(logging.WARNING, logger="autotune"), pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    assert "misbehaved" not in caplog.text


def test_the_guard_reads_the_device_only_every_50_steps(tiny_family: str) -> None:
    """Between reads a finding waits in the buffer: nothing is synchronised per step."""
    guard = _measured(tiny_family, "bf16-mixed").guard()
    for _ in range(49):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is None
    with pytest.warns(ConfigMisbehaved):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is not None and guard.finding.step == 1


def test_the_replay_leaves_the_runs_model_and_random_state_as_they_were(tiny_family: str) -> None:
    """A run whose finding is replayed ends where the same run under a guard that cannot replay ends."""
    config = _measured(tiny_family, "fp16-mixed")
    ends = []
    for replays in (True, False):
        model = build_tiny().model
        guard = None if replays else config.guard()
        with pytest.warns(ConfigMisbehaved, match="it is demoted" if replays else "Not replayed"):
            found, _ = _classifier(config, 60, huge_inputs_at=range(10, 60), model=model, guard=guard)
        assert found.finding is not None and found.finding.step == 10
        ends.append(([p.detach().clone() for p in model.parameters()], torch.get_rng_state()))
    (replayed, rng_replayed), (plain, rng_plain) = ends
    assert all(torch.equal(a, b) for a, b in zip(replayed, plain, strict=True))
    assert torch.equal(rng_replayed, rng_plain)


def test_a_recalibration_keeps_demotions_and_forget_demotion_undoes_them(
    tiny_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _demote_fp16(tiny_family)
    demoted = autotune.best_config(tiny_family)
    _measured_again = family(tiny_family, timed("cpu", "fp16-mixed", 45.0), timed("cpu", "bf16-mixed", 55.0),
                             timed("cpu", "fp32", 100.0))
    _cached.store().save(autotune.fingerprint(), _measured_again)  # what a recalibration stores
    assert autotune.best_config(tiny_family).reason == demoted.reason
    assert main(["--explain", tiny_family]) == 0
    explained = capsys.readouterr().out
    assert "cpu fp16-mixed demoted on" in explained and f"--forget-demotion {tiny_family}" in explained
    assert f"(a run of {model_signature(build_tiny().model)} on cpu fp16-mixed:" in " ".join(explained.split())
    assert "decision: fp16-mixed was demoted after NaN losses" in explained
    assert main(["--forget-demotion", tiny_family]) == 0
    assert "undone: cpu fp16-mixed demoted" in capsys.readouterr().err
    assert autotune.best_config(tiny_family).precision == "fp16-mixed"
    assert _answer.demotions(tiny_family) == []


def test_clear_forgets_demotions(tiny_family: str) -> None:
    _demote_fp16(tiny_family)
    assert _answer.demotions(tiny_family) != []
    assert main(["--clear"]) == 0
    assert _answer.demotions(tiny_family) == []


def _recorded(kind: str, precision: str = "bf16-mixed", step: int = 1) -> Demotion:
    return Demotion(model_kind=kind, candidate=Candidate(device="cpu", precision=precision),  # type: ignore[arg-type]
                    seen="non_finite", step=step, detail="3 NaN losses", evidence=[math.nan, math.inf], at=TODAY,
                    autotune_version="0", model=model_signature(build_tiny().model), family_model=True)


def test_demotions_of_two_families_written_at_once_by_two_processes_are_both_kept(
    tiny_family: str, tmp_path: Path
) -> None:
    autotune.register_family("other", "families_for_tests:build_tiny")
    for kind in (tiny_family, "other"):
        _measured(kind, "bf16-mixed")
    script = textwrap.dedent("""
        import sys, time, autotune
        from autotune._cache import demotions
        from test_guard import _recorded
        kind, start = sys.argv[1], float(sys.argv[2])
        digest = autotune.fingerprint().digest
        time.sleep(max(0.0, start - time.time()))
        for run in range(100):  # each run's demotion rewrites the file: 100 read-merge-writes per process
            demotions.record(digest, _recorded(kind, step=run + 1))
    """)
    start = time.time() + 4.0  # both past their imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", script, kind, str(start)], env=env)
             for kind in (tiny_family, "other")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for kind in (tiny_family, "other"):
        [kept] = _answer.demotions(kind)
        assert kept.step == 100 and kept.seen == "non_finite"  # the last run's
        assert autotune.best_config(kind).reason.startswith("bf16-mixed was demoted after NaN losses at step 100 ")


def test_the_demotions_file_is_strict_json(tiny_family: str, isolated_autotune: Path) -> None:
    """NaN and infinite losses are written as strings, which every JSON parser reads; they read back as floats."""
    _measured(tiny_family, "bf16-mixed")
    demotions.record(autotune.fingerprint().digest, _recorded(tiny_family))

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    path = demotions.path(autotune.fingerprint().digest)
    document = json.loads(path.read_text(), parse_constant=refuse)
    assert document["demotions"][tiny_family][0]["evidence"] == ["NaN", "Infinity"]
    [read] = _answer.demotions(tiny_family)
    assert math.isnan(read.evidence[0]) and read.evidence[1] == math.inf


def test_a_corrupt_demotion_record_is_ignored_with_a_warning(
    tiny_family: str, isolated_autotune: Path, caplog: pytest.LogCaptureFixture
) -> None:
    finding = _demote_fp16(tiny_family)
    path = demotions.path(autotune.fingerprint().digest)
    document = json.loads(path.read_text())
    good = document["demotions"][tiny_family][0]
    document["demotions"][tiny_family] = [{**good, "step": "many", "candidate": {"device": "cpu"}}, good]
    document["demotions"]["broken"] = "not a list"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="autotune"):
        answer = autotune.best_config(tiny_family)
    assert answer.reason.startswith("fp16-mixed was demoted after NaN losses at step 10 ")  # the good one holds
    assert "ignoring an unreadable demotion of 'tiny'" in caplog.text
    # A demotion recorded next keeps the unreadable record as it was read, for a post-mortem.
    demotions.record(autotune.fingerprint().digest, finding.model_copy(update={"step": 2}))
    assert json.loads(path.read_text())["demotions"][tiny_family][0]["step"] == "many"


def test_a_demotions_file_that_is_not_json_never_crashes_best_config(
    tiny_family: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    path = demotions.path(autotune.fingerprint().digest)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b'{"schema_version": 1, "demotions": {"tiny": [')
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert autotune.best_config(tiny_family) == config
    assert "ignoring the demotions file" in caplog.text and "not JSON" in caplog.text
    _demote_fp16(tiny_family)
    assert [d.step for d in _answer.demotions(tiny_family)] == [10]  # written over, the unusable file moved aside
    assert len(list(path.parent.glob("*.corrupt-*"))) == 1


def test_a_candidate_pruned_as_slower_than_the_demoted_one_is_the_answer_after_it(tiny_family: str) -> None:
    """bf16 was dropped in a stage as clearly slower than fp16: with fp16 demoted it is the best the CPU has left."""
    fp16 = timed("cpu", "fp16-mixed", 50.0)
    bf16 = timed("cpu", "bf16-mixed", 70.0)
    assert bf16.timing is not None
    evidence = Drop(by=fp16.candidate, ratio=Interval(estimate=1.4, low=1.3, high=1.5), rounds=3)
    bf16 = bf16.model_copy(update={"timing": bf16.timing.model_copy(update={"stage": 1, "final": False,
                                                                             "dropped": evidence})})
    _cached.store().save(autotune.fingerprint(), family(tiny_family, fp16, bf16))
    config = autotune.best_config(tiny_family)
    assert config.precision == "fp16-mixed"
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50))
    answer = _demoted_answer(tiny_family, "fp16-mixed", "NaN losses", 10, "bf16-mixed")
    assert answer.step_ms == bf16.timing.mean_ms and guard.fallback() == answer


def test_a_demoted_gpu_candidate_leaves_the_cpu_and_the_reason_stays_one_short_sentence(tiny_family: str) -> None:
    variant = timed("cpu", "bf16-mixed", 50.0)
    variant = variant.model_copy(update={"candidate": variant.candidate.model_copy(update={
        "memory_format": "channels_last", "optimizer": "fused", "num_threads": 1, "compiled": True})})
    record = family(tiny_family, timed("cuda:0", "fp16-mixed", 20.0), variant, timed("cpu", "fp32", 100.0))
    _cached.store().save(autotune.fingerprint(), record)
    config = autotune.best_config(tiny_family)
    assert config.device == "cuda:0"
    # No GPU here to replay on: the demotion a GPU run's guard records, as it records it.
    demotions.record(config.fingerprint_digest, _recorded(tiny_family, "fp16-mixed", 1_001).model_copy(update={
        "candidate": config.candidate}))
    answer = autotune.best_config(tiny_family)
    assert answer.candidate == variant.candidate
    assert answer.reason.startswith(f"cuda:0 fp16-mixed was demoted after NaN losses at step 1,001 of training on "
                                    f"{TODAY}; using cpu bf16-mixed")
    assert len(answer.reason) < 160 and answer.reason.count(". ") == 0


def test_a_demotion_that_cannot_be_written_holds_in_this_process(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = _measured(tiny_family, "fp16-mixed")

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the cache
    with caplog.at_level(logging.WARNING, logger="autotune"), pytest.warns(ConfigMisbehaved):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50))
    assert "No space left" in caplog.text and "it holds for this process only" in caplog.text
    assert not demotions.path(autotune.fingerprint().digest).exists()
    assert guard.fallback().precision == "bf16-mixed" and "demoted" in guard.fallback().reason


def _loader_sets_threads(config: Config, count: int) -> None:
    """``config.dataloader_kwargs`` where its answer trains with ``count`` CPU threads beside its workers: measured
    once (real loop, no workers), then the count as a measurement that found fewer threads faster stores it."""
    dataset = TensorDataset(torch.randn(32, 8), torch.randint(0, 4, (32,)))
    measured = config.dataloader_report(dataset, batch_size=8, budget_s=0.2, num_workers=0)
    answers = loader_answers.Answers(config.fingerprint_digest)
    [question] = loader_answers.FILES.read(config.fingerprint_digest)
    answers.put(question, measured.model_copy(update={"num_threads": count}))
    config.dataloader_kwargs(dataset, batch_size=8, num_workers=0)


@pytest.mark.parametrize("how", ["set_num_threads", "apply_threads", "dataloader_kwargs"])
def test_the_apps_thread_count_keeps_the_answer_its_demotion_and_the_fallback(tiny_family: str, how: str) -> None:
    """The count the app trains with moves (its own call, the count the answer measured, the DataLoader's): the
    answer, its demotion and the guard's fallback stay on the machine configuration they were answered under."""
    other = torch.get_num_threads() + 1  # the conftest puts the count back
    bf16 = timed("cpu", "bf16-mixed", 70.0)
    bf16 = bf16.model_copy(update={"candidate": bf16.candidate.model_copy(update={"num_threads": other})})
    _cached.store().save(autotune.fingerprint(), family(tiny_family, timed("cpu", "fp16-mixed", 50.0), bf16,
                                                        timed("cpu", "fp32", 100.0)))
    config = autotune.best_config(tiny_family)
    assert config.precision == "fp16-mixed"
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50))
    demoted = autotune.best_config(tiny_family)
    assert demoted.reason.startswith("fp16-mixed was demoted after NaN losses at step 10 of training")
    assert demoted.precision == "bf16-mixed" and demoted.num_threads == other and demoted.source == "measured"
    if how == "set_num_threads":
        torch.set_num_threads(other)
    elif how == "apply_threads":
        demoted.apply_threads()
    else:
        _loader_sets_threads(config, other)
    assert torch.get_num_threads() == other
    model = build_tiny().model  # the family's own, as the guard's run trained it
    for answer in (autotune.best_config(tiny_family), autotune.best_config(tiny_family, wait=False),
                   autotune.best_config(tiny_family, model=model), guard.fallback()):
        assert answer == demoted


@pytest.mark.usefixtures("in_process")
def test_a_real_recalibration_keeps_the_demotion(tiny_family: str) -> None:
    _demote_fp16(tiny_family)
    before = _answer.demotions(tiny_family)
    autotune.calibrate([tiny_family], force=True)  # measures this CPU: its pick is this machine's
    assert _answer.demotions(tiny_family) == before
    answer = autotune.best_config(tiny_family)
    assert answer.precision != "fp16-mixed" and answer.reason.startswith("fp16-mixed was demoted after NaN losses")


def test_steps_ten_times_slower_for_a_sustained_window_suggest_check_and_demote_nothing(
    tiny_family: str, isolated_autotune: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop whose steps wait 1 ms, then 10 ms (another workload took the machine): a hint, not a finding."""
    guard = _measured(tiny_family, "bf16-mixed").guard()
    with caplog.at_level(logging.WARNING, logger="autotune"):
        for step in range(1, 551):
            time.sleep(0.001 if step <= 300 else 0.01)
            guard.step(1.0)
    assert "python -m autotune --check" in caplog.text and "this run's fastest" in caplog.text
    assert guard.finding is None and not (isolated_autotune / "demotions").exists()


def test_a_demotion_the_disk_refused_is_written_with_the_next_one(
    isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def demotion(precision: str) -> Demotion:
        return Demotion(model_kind="tiny", candidate=Candidate(device="cpu", precision=precision),  # type: ignore[arg-type]
                        seen="non_finite", step=10, detail="3 NaN losses", evidence=[math.nan], at=TODAY,
                        autotune_version="0")

    digest = autotune.fingerprint().digest
    replace = os.replace

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        demotions.record(digest, demotion("bf16-mixed"))
    assert "it holds for this process only" in caplog.text
    monkeypatch.setattr(os, "replace", replace)  # the disk has room again
    demotions.record(digest, demotion("fp16-mixed"))
    demotions.reset()  # what this process kept is gone: only the file speaks
    assert [d.candidate.precision for d in demotions.of(digest, "tiny")] == ["bf16-mixed", "fp16-mixed"]


def test_forget_demotion_says_so_when_the_file_cannot_be_rewritten(
    isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = autotune.fingerprint().digest
    demotions.record(digest, Demotion(
        model_kind="tiny", candidate=Candidate(device="cpu", precision="bf16-mixed"), seen="non_finite", step=10,
        detail="3 NaN losses", evidence=[math.nan], at=TODAY, autotune_version="0"))

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["--forget-demotion", "tiny"]) == 1
    assert "still hold" in capsys.readouterr().err



def test_a_zero_optimizer_is_said_once_and_guard_step_never_raises(
    tiny_family: str, isolated_autotune: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ZeroRedundancyOptimizer's state_dict() raises until a collective gathers it: no state to replay from.
    from torch import distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    config = _measured(tiny_family, "fp16-mixed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = build_tiny().model
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        guard = config.guard(model, optimizer, loss_fn=_loss)
        scaler = config.grad_scaler()
        features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
        with pytest.warns(ConfigMisbehaved, match="ZeroRedundancyOptimizer.*so nothing is demoted"):
            for step in range(1, 51):
                batch = (features * (1e5 if step >= 10 else 1.0), labels, 1.0)
                with config.autocast():
                    loss = _loss(model, batch)
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
    config = _measured(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"Not replayed: .*state \(0.00\d+ MiB\) is more than 25% of the host "
                      r"memory available \(0.0039\d MiB\)"):
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50))
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
    config = _measured(tiny_family, "bf16-mixed")
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
    config = _measured(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match="it is demoted") as warned:
        guard, _ = _classifier(config, 50, huge_inputs_at=range(10, 50), clip=clip)
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
    config = _measured(tiny_family, "bf16-mixed")
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
    config = _measured(tiny_family, "bf16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"fp32 misbehaves too .*nothing is demoted"):
        guard, _ = _classifier(config, 200, lr_factor=lambda done: 1e8 if 99 <= done < 119 else 1.0)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "training" and guard.finding.replay.detail == ""
    assert guard.finding.step < 150 and not (isolated_autotune / "demotions").exists()
