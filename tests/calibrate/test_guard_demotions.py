"""What a demotion leaves: the answer it changes and keeps through recalibrations and the app's own settings, the
demotions file (strict JSON, written by two processes at once, corrupt, unwritable), and forgetting it.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from families_for_tests import build_tiny
from guard_for_tests import (
    TODAY,
    classifier,
    demote_fp16,
    demoted_answer,
    measured_config,
)
from samples import family, timed
from torch.utils.data import TensorDataset

import autotune
from autotune import Config, ConfigMisbehaved, _answer
from autotune._cache import demotions, loader_answers
from autotune._cache import lookup as _cached
from autotune._cli import main
from autotune._guard.watch import model_signature
from autotune._records import Candidate, Demotion, Drop, Interval


def test_a_recalibration_keeps_demotions_and_forget_demotion_undoes_them(
    tiny_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    demote_fp16(tiny_family)
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
    demote_fp16(tiny_family)
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
        measured_config(kind, "bf16-mixed")
    script = textwrap.dedent("""
        import sys, time, autotune
        from autotune._cache import demotions
        from test_guard_demotions import _recorded
        kind, start = sys.argv[1], float(sys.argv[2])
        digest = autotune.fingerprint().digest
        time.sleep(max(0.0, start - time.time()))
        for run in range(100):  # each run's demotion rewrites the file: 100 read-merge-writes per process
            demotions.record(digest, _recorded(kind, step=run + 1))
    """)
    start = time.time() + 4.0  # both past their imports
    here, tests = str(Path(__file__).parent), str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, tests, os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", script, kind, str(start)], env=env)
             for kind in (tiny_family, "other")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for kind in (tiny_family, "other"):
        [kept] = _answer.demotions(kind)
        assert kept.step == 100 and kept.seen == "non_finite"  # the last run's
        assert autotune.best_config(kind).reason.startswith("bf16-mixed was demoted after NaN losses at step 100 ")


def test_the_demotions_file_is_strict_json(tiny_family: str, isolated_autotune: Path) -> None:
    """NaN and infinite losses are written as strings, which every JSON parser reads; they read back as floats."""
    measured_config(tiny_family, "bf16-mixed")
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
    finding = demote_fp16(tiny_family)
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
    config = measured_config(tiny_family, "fp16-mixed")
    path = demotions.path(autotune.fingerprint().digest)
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b'{"schema_version": 1, "demotions": {"tiny": [')
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert autotune.best_config(tiny_family) == config
    assert "the demotions file" in caplog.text and "was corrupt" in caplog.text and "not JSON" in caplog.text
    assert len(list(path.parent.glob("*.corrupt-*"))) == 1  # moved aside when read
    demote_fp16(tiny_family)
    assert [d.step for d in _answer.demotions(tiny_family)] == [10]
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
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50))
    answer = demoted_answer(tiny_family, "fp16-mixed", "NaN losses", 10, "bf16-mixed")
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
    config = measured_config(tiny_family, "fp16-mixed")

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the cache
    with caplog.at_level(logging.WARNING, logger="autotune"), pytest.warns(ConfigMisbehaved):
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50))
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
        guard, _ = classifier(config, 50, huge_inputs_at=range(10, 50))
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
    demote_fp16(tiny_family)
    before = _answer.demotions(tiny_family)
    autotune.calibrate([tiny_family], force=True)  # measures this CPU: its pick is this machine's
    assert _answer.demotions(tiny_family) == before
    answer = autotune.best_config(tiny_family)
    assert answer.precision != "fp16-mixed" and answer.reason.startswith("fp16-mixed was demoted after NaN losses")


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
