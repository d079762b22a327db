"""The guard in the training loop, on real training runs on the CPU: real models, real autocast, torch's own
GradScaler ("cpu"), the real cache, the real replay. What goes wrong is caused, not faked: gradients that overflow
fp16 from step N, activations that overflow fp16 (NaN losses), a learning rate past the stability limit (slow
divergence, or a blow-up to NaN in any precision).

The measured record the guard's Config comes from is hand-made (``samples``): which precision wins on this CPU is
not the subject, and each test needs a known pick to demote."""

from __future__ import annotations

import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from families_for_tests import build_tiny
from guard_for_tests import (
    TODAY,
    classifier,
    classifier_loss,
    demote_fp16,
    demoted_answer,
    measured_config,
    regression,
    stored_demotions,
)
from torch import nn

import autotune
from autotune import ConfigMisbehaved
from autotune._cache import demotions
from autotune._guard.watch import NON_FINITE_LOSSES, SKIPPED_STEPS, model_signature
from autotune._records import Demotion


def test_fp16_gradients_overflowing_from_step_n_demote_fp16(tiny_family: str, isolated_autotune: Path) -> None:
    config = measured_config(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"tiny on cpu fp16-mixed misbehaved at step 120: GradScaler skipped 25 "
                      r"optimizer steps in a row and did not recover.*Replayed from step \d+ "
                      r"on the \d+ batches since, fp16-mixed misbehaves again \(at replayed step \d+\) and fp32 does "
                      r"not.*--forget-demotion tiny"):
        guard, skipped = classifier(config, 200, overflow_at=range(120, 200))
    # Which snapshot it replays from depends on how long snapshots took (wall time); from any, the replay
    # misbehaves at the step the run did.
    replay = guard.finding.replay if guard.finding is not None else None
    assert replay is not None and replay.from_step is not None and replay.run_at is not None
    assert replay.from_step + replay.run_at == 120
    assert skipped >= 10  # the scale kept halving, as GradScaler does
    assert guard.finding is not None and guard.finding.seen == "skipped_steps" and guard.finding.step == 120
    assert guard.finding.evidence == sorted(guard.finding.evidence, reverse=True)  # the scale at each skip, halving
    [stored] = stored_demotions(isolated_autotune)[tiny_family]
    assert (stored["seen"], stored["step"], stored["candidate"], stored["model"], stored["family_model"]) == (
        "skipped_steps", 120, {"device": "cpu", "precision": "fp16-mixed", "memory_format": "contiguous",
                               "optimizer": "default", "num_threads": None, "compiled": False},
        model_signature(build_tiny().model), True)
    assert stored["replay"]["blame"] == "configuration"  # type: ignore[index]
    answer = demoted_answer(tiny_family, "fp16-mixed", "skipped optimizer steps", 120, "bf16-mixed")
    assert guard.fallback() == answer
    assert answer.evidence is not None and answer.evidence.demotions == [guard.finding]


def test_nan_losses_from_step_n_demote(tiny_family: str, isolated_autotune: Path) -> None:
    config = measured_config(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step 150: 3 non-finite losses within 100 steps "
                      r"\(steps 150, 151, 152; the last finite one"):
        guard, _ = classifier(config, 200, huge_inputs_at=range(150, 200))
    assert guard.finding is not None and guard.finding.seen == "non_finite" and guard.finding.step == 150
    assert stored_demotions(isolated_autotune)[tiny_family][0]["detail"] == guard.finding.detail
    demoted_answer(tiny_family, "fp16-mixed", "NaN losses", 150, "bf16-mixed")


def test_calibrate_reports_the_answer_best_config_gives_after_a_demotion(tiny_family: str) -> None:
    # One answer path: the report's Config for a family leaves out what training demoted here, as best_config does.
    demote_fp16(tiny_family)
    report = autotune.calibrate([tiny_family])  # the stored record answers: nothing is measured again
    assert report.configs[tiny_family] == autotune.best_config(tiny_family)
    assert report.configs[tiny_family].precision == "bf16-mixed" and "demoted" in report.configs[tiny_family].reason


def test_the_guard_a_config_makes_is_an_autotune_guard_and_answers_again_with_best_config(tiny_family: str) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    guard = config.guard()
    assert isinstance(guard, autotune.Guard)
    assert guard.fallback() == config


def test_a_guard_made_by_hand_answers_again_with_the_function_it_is_given(tiny_family: str) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    by_hand = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest, answer=autotune.best_config)
    assert by_hand.fallback() == config
    given = autotune.Guard(tiny_family, config.candidate, config.fingerprint_digest,
                           answer=lambda kind, **options: autotune.best_config(kind, **{**options, "prefer": "cpu"}))
    assert given.fallback() == autotune.best_config(tiny_family, prefer="cpu")


def test_a_guard_made_by_hand_without_an_answer_watches_and_says_what_to_pass_at_fallback(tiny_family: str) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
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
    config = measured_config(tiny_family, "fp16-mixed")
    model = build_tiny().model
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = config.guard(model, optimizer, loss_fn=classifier_loss)
    scaler = config.grad_scaler()
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    loader = [(features * (1e5 if step >= 10 else 1.0), labels, 1.0) for step in range(1, 51)]
    with pytest.warns(ConfigMisbehaved, match="it is demoted"):
        for batch in guard.data(loader):
            with config.autocast():
                loss = classifier_loss(model, batch)
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
    config = measured_config(tiny_family, pick)
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step 1\d\d: 3 non-finite losses.*fp32 misbehaves too "
                      r"\(at replayed step \d+\): it is the training, not the configuration, so nothing is demoted: "
                      r"look at the learning rate"):
        guard, _ = classifier(config, 200, lr_from_100=1e6)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "training" and guard.finding.replay.reference_at is not None
    assert not (isolated_autotune / "demotions").exists()
    assert autotune.best_config(tiny_family) == config and guard.fallback() == config


def test_a_slow_divergence_from_a_learning_rate_past_its_limit_demotes_nothing(
    tiny_family: str, isolated_autotune: Path
) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step \d+: the loss rose from its floor.*fp32 "
                      "misbehaves too.*nothing is demoted"):
        guard = regression(config, 800, lr_from_300=1.005)
    finding = guard.finding
    assert finding is not None and finding.seen == "diverged"
    # It began after the change, and was found while the loss was finite: a slow rise, blocks of 50 steps.
    assert 301 <= finding.step <= 601 and (finding.step - 1) % 50 == 0
    assert all(value < 1e6 for value in finding.evidence)
    assert not (isolated_autotune / "demotions").exists()


def test_a_loss_that_rises_less_than_half_its_progress_is_no_divergence(tiny_family: str) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard = regression(config, 800, lr_from_300=0.99)
    assert guard.finding is None and autotune.best_config(tiny_family).precision == "bf16-mixed"


def test_a_healthy_run_with_gradscalers_first_back_offs_finds_nothing(tiny_family: str,
                                                                       isolated_autotune: Path) -> None:
    config = measured_config(tiny_family, "fp16-mixed")
    assert config.grad_scaler().get_scale() == 65536.0  # GradScaler's default: too high for these gradients
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard, skipped = classifier(config, 300, loss_weight=100.0)
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
    config = measured_config(tiny_family, "fp16-mixed")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        guard, _ = classifier(config, 300, huge_inputs_at=bad_steps)
    assert len(seen) == found
    assert (guard.finding.step if guard.finding else None) == (100 if found else None)
    assert ("demoted" in autotune.best_config(tiny_family).reason) == found


@pytest.mark.parametrize(("skips", "found"), [
    pytest.param(SKIPPED_STEPS - 1, False, id="three-skips"), pytest.param(SKIPPED_STEPS, True, id="four-skips"),
])
def test_back_offs_after_the_scale_settles_are_a_finding_from_four_in_100_steps(
    tiny_family: str, skips: int, found: bool
) -> None:
    config = measured_config(tiny_family, "fp16-mixed")
    overflow_at = range(100, 100 + 20 * skips, 20)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        guard, skipped = classifier(config, 250, overflow_at=overflow_at)
    assert skipped >= skips
    assert len(seen) == found and (guard.finding is not None) == found


def test_a_gradscaler_back_off_after_a_spike_it_recovers_from_is_no_finding(
    tiny_family: str, isolated_autotune: Path
) -> None:
    # Four steps in a row whose fp16 gradients overflow: GradScaler skips them, halving its scale, and goes on.
    config = measured_config(tiny_family, "fp16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        guard, skipped = classifier(config, 250, overflow_at=range(150, 150 + SKIPPED_STEPS))
    assert skipped >= SKIPPED_STEPS and guard.finding is None
    assert not (isolated_autotune / "demotions").exists()


def test_a_finding_whose_batches_are_gone_is_not_reproduced_and_demotes_nothing(
    tiny_family: str, isolated_autotune: Path
) -> None:
    """Batches of 4 MiB: the guard keeps the last 31 (128 MiB in all); the three that overflowed (steps 10-12) are
    older."""
    config = measured_config(tiny_family, "fp16-mixed")
    with pytest.warns(ConfigMisbehaved, match=r"Replayed from step 1 on the last 31 of the 49 batches since, "
                      r"neither fp16-mixed nor fp32 misbehaves: the batches that did are gone, so nothing is demoted"):
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 13), images_mb=4)
    assert guard.finding is not None and guard.finding.replay is not None
    assert guard.finding.replay.blame == "not_reproduced"
    assert not (isolated_autotune / "demotions").exists()


def test_one_apps_model_cannot_demote_another_apps(tiny_family: str) -> None:
    """A wider model than the family builds overflows fp16: the demotion holds for it, not for the family's own."""
    config = measured_config(tiny_family, "fp16-mixed")
    wider = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    with pytest.warns(ConfigMisbehaved, match="it is demoted on this machine for this model"):
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50), model=wider)
    assert guard.finding is not None and not guard.finding.family_model
    assert autotune.best_config(tiny_family) == config  # the family's own model: not demoted
    for answer in (autotune.best_config(tiny_family, model=wider), guard.fallback()):
        assert answer.precision == "bf16-mixed" and answer.reason.startswith("fp16-mixed was demoted")
    same_shapes = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))  # another instance: the same model
    assert autotune.best_config(tiny_family, model=same_shapes).precision == "bf16-mixed"
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        autotune.best_config(tiny_family, model="wider")  # type: ignore[arg-type]


def test_a_demotion_an_older_autotune_recorded_holds_for_the_familys_own_model(tiny_family: str) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    demotions.record(config.fingerprint_digest, Demotion(
        model_kind=tiny_family, candidate=config.candidate, seen="non_finite", step=10, detail="3 NaN losses",
        evidence=[math.nan], at=TODAY, autotune_version="0.1.0"))
    assert autotune.best_config(tiny_family).precision == "fp32"
    assert autotune.best_config(tiny_family, model=nn.Linear(8, 4)).precision == "bf16-mixed"


def test_fp32_on_the_cpu_is_reported_never_demoted(tiny_family: str, isolated_autotune: Path) -> None:
    config = measured_config(tiny_family, "bf16-mixed").model_copy(update={"precision": "fp32"})
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match="fp32 on the CPU is the reference.*nothing is demoted"):
        for _ in range(10):
            guard.step(torch.tensor(float("nan")))
        guard.check()
    assert guard.finding is not None and not (isolated_autotune / "demotions").exists()


def test_a_guard_without_the_model_warns_and_demotes_nothing_saying_why(
    tiny_family: str, isolated_autotune: Path
) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
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
    pytest.param({"loss_fn": classifier_loss}, "model, optimizer", id="loss-alone"),
])
def test_a_guard_given_part_of_what_a_replay_needs_says_what_is_missing(
    tiny_family: str, given: dict[str, Any], missing: str
) -> None:
    config = measured_config(tiny_family, "bf16-mixed")
    with pytest.raises(TypeError, match=f"{missing} missing"):
        config.guard(**given)


def test_a_loss_of_more_than_one_value_is_refused_with_what_to_pass(tiny_family: str) -> None:
    guard = measured_config(tiny_family, "bf16-mixed").guard()
    with pytest.raises(ValueError, match=r"shape \(4,\): pass the loss you call backward\(\) on"):
        guard.step(torch.ones(4))
    guard.step(torch.ones(1))  # DataParallel's (1,)-shaped loss is one value


def test_a_finding_is_one_warning_not_also_a_log_line(
    tiny_family: str, caplog: pytest.LogCaptureFixture
) -> None:
    guard = measured_config(tiny_family, "bf16-mixed").guard()
    with caplog.at_level(logging.WARNING, logger="autotune"), pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    assert "misbehaved" not in caplog.text


def test_the_guard_reads_the_device_only_every_50_steps(tiny_family: str) -> None:
    """Between reads a finding waits in the buffer: nothing is synchronised per step."""
    guard = measured_config(tiny_family, "bf16-mixed").guard()
    for _ in range(49):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is None
    with pytest.warns(ConfigMisbehaved):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is not None and guard.finding.step == 1


def test_steps_ten_times_slower_for_a_sustained_window_suggest_check_and_demote_nothing(
    tiny_family: str, isolated_autotune: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop whose steps wait 1 ms, then 10 ms (another workload took the machine): a hint, not a finding."""
    guard = measured_config(tiny_family, "bf16-mixed").guard()
    with caplog.at_level(logging.WARNING, logger="autotune"):
        for step in range(1, 551):
            time.sleep(0.001 if step <= 300 else 0.01)
            guard.step(1.0)
    assert "python -m autotune --check" in caplog.text and "this run's fastest" in caplog.text
    assert guard.finding is None and not (isolated_autotune / "demotions").exists()
