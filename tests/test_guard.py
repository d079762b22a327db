"""The guard in the training loop, on real training runs on the CPU: real models, real autocast, torch's own
GradScaler ("cpu"), the real cache. What goes wrong is caused, not faked: gradients that overflow fp16 from step N,
activations that overflow fp16 (NaN losses), a learning rate past the stability limit (slow divergence).

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
from collections.abc import Collection
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from samples import family, timed
from torch import nn

import autotune
from autotune import Config, ConfigMisbehaved, _answer
from autotune._cache import demotions
from autotune._cache import lookup as _cached
from autotune._cli import main
from autotune._guard import NON_FINITE_LOSSES, SKIPPED_STEPS
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


def _classifier(config: Config, guard: autotune.Guard, steps: int, *, overflow_at: Collection[int] = (),
                huge_inputs_at: Collection[int] = (), loss_weight: float = 1.0) -> int:
    """Train a small classifier; at ``overflow_at`` steps the loss is weighted 1e6 (its fp16 gradients overflow),
    at ``huge_inputs_at`` the inputs are 1e5 times larger (fp16 activations overflow: NaN loss). Returns the steps
    GradScaler skipped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = config.grad_scaler()
    features, labels = torch.randn(64, 8), torch.randint(0, 4, (64,))
    skipped = 0
    for step in range(1, steps + 1):
        with config.autocast():
            logits = model(features * (1e5 if step in huge_inputs_at else 1.0))
            loss = F.cross_entropy(logits, labels) * (1e6 if step in overflow_at else loss_weight)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        before = scaler.get_scale() if scaler.is_enabled() else 0.0
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.is_enabled() and scaler.get_scale() < before
        guard.step(loss, scaler)
    guard.check()
    return skipped


def _regression(config: Config, guard: autotune.Guard, steps: int, *, lr_from_300: float) -> None:
    """Full-batch least squares (Hessian 2I): SGD converges at lr 0.05; from step 300 ``lr_from_300``, past 1.0
    the error grows a little at each step (slow divergence), just under 1.0 it stays bounded."""
    torch.manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(256, 8))
    features = basis * 16
    targets = features @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
    model = nn.Linear(8, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, steps + 1):
        if step == 300:
            optimizer.param_groups[0]["lr"] = lr_from_300
        with config.autocast():
            loss = F.mse_loss(model(features).float(), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        guard.step(loss)
    guard.check()


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
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match=r"tiny on cpu fp16-mixed misbehaved at step 120: 4 optimizer steps "
                      r"skipped by GradScaler within 100 steps \(steps 120, 121, 122, 123\).*--forget-demotion tiny"):
        skipped = _classifier(config, guard, 200, overflow_at=range(120, 200))
    assert skipped >= 10  # the scale kept halving, as GradScaler does
    assert guard.finding is not None and guard.finding.seen == "skipped_steps" and guard.finding.step == 120
    assert guard.finding.evidence == sorted(guard.finding.evidence, reverse=True)  # the scale at each skip, halving
    stored = _stored(isolated_autotune)[tiny_family]
    assert [(d["seen"], d["step"], d["candidate"]) for d in stored] == [  # type: ignore[index]
        ("skipped_steps", 120, {"device": "cpu", "precision": "fp16-mixed", "memory_format": "contiguous",
                                "optimizer": "default", "num_threads": None, "compiled": False})]
    answer = _demoted_answer(tiny_family, "fp16-mixed", "skipped optimizer steps", 120, "bf16-mixed")
    assert guard.fallback() == answer


def test_nan_losses_from_step_n_demote(tiny_family: str, isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step 150: 3 non-finite losses within 100 steps "
                      r"\(steps 150, 151, 152; the last finite one"):
        _classifier(config, guard, 200, huge_inputs_at=range(150, 200))
    assert guard.finding is not None and guard.finding.seen == "non_finite" and guard.finding.step == 150
    assert _stored(isolated_autotune)[tiny_family][0]["detail"] == guard.finding.detail
    _demoted_answer(tiny_family, "fp16-mixed", "NaN losses", 150, "bf16-mixed")


def test_slow_divergence_demotes_bf16_for_fp32(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match=r"misbehaved at step \d+: the loss rose from its floor"):
        _regression(config, guard, 800, lr_from_300=1.005)
    finding = guard.finding
    assert finding is not None and finding.seen == "diverged"
    # It began after the change, and was found while the loss was finite: a slow rise, blocks of 50 steps.
    assert 301 <= finding.step <= 601 and (finding.step - 1) % 50 == 0
    assert all(value < 1e6 for value in finding.evidence)
    _demoted_answer(tiny_family, "bf16-mixed", "a diverging loss", finding.step, "fp32")


def test_a_loss_that_rises_less_than_half_its_progress_is_no_divergence(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        _regression(config, guard, 800, lr_from_300=0.99)
    assert guard.finding is None and autotune.best_config(tiny_family).precision == "bf16-mixed"


def test_a_healthy_run_with_gradscalers_first_back_offs_finds_nothing(tiny_family: str,
                                                                       isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    assert config.grad_scaler().get_scale() == 65536.0  # GradScaler's default: too high for these gradients
    guard = config.guard()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigMisbehaved)
        skipped = _classifier(config, guard, 300, loss_weight=100.0)
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
    guard = config.guard()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        _classifier(config, guard, 300, huge_inputs_at=bad_steps)
    assert len(seen) == found
    assert (guard.finding.step if guard.finding else None) == (100 if found else None)
    assert ("demoted" in autotune.best_config(tiny_family).reason) == found


@pytest.mark.parametrize(("skips", "found"), [
    pytest.param(SKIPPED_STEPS - 1, False, id="three-skips"), pytest.param(SKIPPED_STEPS, True, id="four-skips"),
])
def test_skipped_steps_after_the_scale_settles_are_a_finding_from_four_in_100_steps(
    tiny_family: str, skips: int, found: bool
) -> None:
    config = _measured(tiny_family, "fp16-mixed")
    guard = config.guard()
    overflow_at = range(100, 100 + 20 * skips, 20)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ConfigMisbehaved)
        skipped = _classifier(config, guard, 250, overflow_at=overflow_at)
    assert skipped >= skips
    assert len(seen) == found and (guard.finding is not None) == found


def test_fp32_on_the_cpu_is_reported_never_demoted(tiny_family: str, isolated_autotune: Path) -> None:
    config = _measured(tiny_family, "bf16-mixed").model_copy(update={"precision": "fp32"})
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved, match="fp32 on the CPU is the reference.*nothing is demoted"):
        for _ in range(10):
            guard.step(torch.tensor(float("nan")))
        guard.check()
    assert guard.finding is not None and not (isolated_autotune / "demotions").exists()


def test_on_failure_raise_raises_at_the_read_that_finds_it(tiny_family: str) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard(on_failure="raise")
    with pytest.raises(ConfigMisbehaved, match="at step 7: 3 non-finite") as raised:
        for step in range(1, 51):
            guard.step(torch.tensor(1.0 if step < 7 else float("inf")))
    assert raised.value.step == 7 and raised.value.demoted
    assert isinstance(raised.value, autotune.AutotuneError)
    _demoted_answer(tiny_family, "bf16-mixed", "infinite losses", 7, "fp32")


def test_the_guard_reads_the_device_only_every_50_steps(tiny_family: str) -> None:
    """Between reads a finding waits in the buffer: nothing is synchronised per step."""
    guard = _measured(tiny_family, "bf16-mixed").guard()
    for _ in range(49):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is None
    with pytest.warns(ConfigMisbehaved):
        guard.step(torch.tensor(float("nan")))
    assert guard.finding is not None and guard.finding.step == 1


def test_a_recalibration_keeps_demotions_and_forget_demotion_undoes_them(
    tiny_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    with pytest.warns(ConfigMisbehaved):
        _regression(config, config.guard(), 800, lr_from_300=1.005)
    demoted = autotune.best_config(tiny_family)
    _measured_again = family(tiny_family, timed("cpu", "bf16-mixed", 55.0), timed("cpu", "fp32", 100.0))
    _cached.store().save(autotune.fingerprint(), _measured_again)  # what a recalibration stores
    assert autotune.best_config(tiny_family).reason == demoted.reason
    assert main(["--explain", tiny_family]) == 0
    explained = capsys.readouterr().out
    assert "cpu bf16-mixed demoted on" in explained and f"--forget-demotion {tiny_family}" in explained
    assert "decision: bf16-mixed was demoted after a diverging loss" in explained
    assert main(["--forget-demotion", tiny_family]) == 0
    assert "undone: cpu bf16-mixed demoted" in capsys.readouterr().err
    assert autotune.best_config(tiny_family).precision == "bf16-mixed"
    assert _answer.demotions(tiny_family) == []


def test_clear_forgets_demotions(tiny_family: str) -> None:
    guard = _measured(tiny_family, "bf16-mixed").guard()
    with pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    assert _answer.demotions(tiny_family) != []
    assert main(["--clear"]) == 0
    assert _answer.demotions(tiny_family) == []


def test_demotions_of_two_families_written_at_once_by_two_processes_are_both_kept(
    tiny_family: str, tmp_path: Path
) -> None:
    autotune.register_family("other", "families_for_tests:build_tiny")
    for kind in (tiny_family, "other"):
        _measured(kind, "bf16-mixed")
    script = textwrap.dedent("""
        import sys, time, warnings, autotune
        kind, start = sys.argv[1], float(sys.argv[2])
        config = autotune.Config(model_kind=kind, device="cpu", precision="bf16-mixed", source="measured",
                                 reason="r", fingerprint_digest=autotune.fingerprint().digest)
        time.sleep(max(0.0, start - time.time()))
        warnings.simplefilter("ignore")
        for run in range(100):  # each run's finding rewrites the file: 100 read-merge-writes per process
            guard = config.guard()
            for step in range(run + 3):
                guard.step(1.0 if step < run else float("nan"))
            guard.check()
            assert guard.finding is not None
    """)
    start = time.time() + 4.0  # both past their imports
    procs = [subprocess.Popen([sys.executable, "-c", script, kind, str(start)]) for kind in (tiny_family, "other")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for kind in (tiny_family, "other"):
        [kept] = _answer.demotions(kind)
        assert kept.step == 100 and kept.seen == "non_finite"  # the last run's
        assert autotune.best_config(kind).reason.startswith("bf16-mixed was demoted after NaN losses at step 100 ")


def test_a_corrupt_demotion_record_is_ignored_with_a_warning(
    tiny_family: str, isolated_autotune: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    path = demotions.path(autotune.fingerprint().digest)
    document = json.loads(path.read_text())
    good = document["demotions"][tiny_family][0]
    document["demotions"][tiny_family] = [{**good, "step": "many", "candidate": {"device": "cpu"}}, good]
    document["demotions"]["broken"] = "not a list"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="autotune"):
        answer = autotune.best_config(tiny_family)
    assert answer.reason.startswith("bf16-mixed was demoted after NaN losses at step 1 ")  # the good one holds
    assert "ignoring an unreadable demotion of 'tiny'" in caplog.text
    # A demotion recorded next keeps the unreadable record as it was read, for a post-mortem.
    assert guard.finding is not None
    demotions.record(autotune.fingerprint().digest, guard.finding.model_copy(update={"step": 2}))
    assert json.loads(path.read_text())["demotions"][tiny_family][0]["step"] == "many"


def test_a_demotions_file_that_is_not_json_never_crashes_best_config(
    tiny_family: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = _measured(tiny_family, "bf16-mixed")
    path = demotions.path(autotune.fingerprint().digest)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b'{"schema_version": 1, "demotions": {"tiny": [')
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert autotune.best_config(tiny_family) == config
    assert "ignoring the demotions file" in caplog.text and "not JSON" in caplog.text
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    assert [d.step for d in _answer.demotions(tiny_family)] == [1]  # written over, the unusable file moved aside
    assert len(list(path.parent.glob("*.corrupt-*"))) == 1


def test_a_candidate_pruned_as_slower_than_the_demoted_one_is_the_answer_after_it(tiny_family: str) -> None:
    """fp32 was dropped in a stage as clearly slower than bf16: with bf16 demoted it is the best the CPU has left."""
    bf16 = timed("cpu", "bf16-mixed", 60.0)
    fp32 = timed("cpu", "fp32", 100.0)
    assert fp32.timing is not None
    evidence = Drop(by=bf16.candidate, ratio=Interval(estimate=1.6, low=1.5, high=1.7), rounds=3)
    fp32 = fp32.model_copy(update={"timing": fp32.timing.model_copy(update={"stage": 1, "final": False,
                                                                             "dropped": evidence})})
    _cached.store().save(autotune.fingerprint(), family(tiny_family, bf16, fp32))
    config = autotune.best_config(tiny_family)
    assert config.precision == "bf16-mixed"
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    answer = _demoted_answer(tiny_family, "bf16-mixed", "NaN losses", 1, "fp32")
    assert answer.step_ms == fp32.timing.median_ms and guard.fallback() == answer


def test_a_demoted_gpu_candidate_leaves_the_cpu_and_the_reason_stays_one_short_sentence(tiny_family: str) -> None:
    variant = timed("cpu", "bf16-mixed", 50.0)
    variant = variant.model_copy(update={"candidate": variant.candidate.model_copy(update={
        "memory_format": "channels_last", "optimizer": "fused", "num_threads": 1, "compiled": True})})
    record = family(tiny_family, timed("cuda:0", "fp16-mixed", 20.0), variant, timed("cpu", "fp32", 100.0))
    _cached.store().save(autotune.fingerprint(), record)
    config = autotune.best_config(tiny_family)
    assert config.device == "cuda:0"
    guard = config.guard()
    with pytest.warns(ConfigMisbehaved):
        for step in range(1, 1_004):
            guard.step(float("nan") if step > 1_000 else 1.0)
        guard.check()
    answer = autotune.best_config(tiny_family)
    assert answer.candidate == variant.candidate
    assert answer.reason.startswith(f"cuda:0 fp16-mixed was demoted after NaN losses at step 1,001 of training on "
                                    f"{TODAY}; using cpu bf16-mixed")
    assert len(answer.reason) < 160 and answer.reason.count(". ") == 0


def test_a_demotion_that_cannot_be_written_holds_in_this_process(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = _measured(tiny_family, "bf16-mixed")

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the cache
    guard = config.guard()
    with caplog.at_level(logging.WARNING, logger="autotune"), pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    assert "No space left" in caplog.text and "it holds for this process only" in caplog.text
    assert not demotions.path(autotune.fingerprint().digest).exists()
    assert guard.fallback().precision == "fp32" and "demoted" in guard.fallback().reason


@pytest.mark.usefixtures("in_process")
def test_a_real_recalibration_keeps_the_demotion(tiny_family: str) -> None:
    guard = _measured(tiny_family, "bf16-mixed").guard()
    with pytest.warns(ConfigMisbehaved):
        for _ in range(3):
            guard.step(float("nan"))
        guard.check()
    before = _answer.demotions(tiny_family)
    autotune.calibrate([tiny_family], force=True)  # measures this CPU: its pick is this machine's
    assert _answer.demotions(tiny_family) == before
    answer = autotune.best_config(tiny_family)
    assert answer.precision != "bf16-mixed" and answer.reason.startswith("bf16-mixed was demoted after NaN losses")


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
