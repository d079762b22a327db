"""The largest batch that fits (issue #15): real probes in real worker processes, on the CPU.

Limits are small (tens of MiB over what the worker already holds) so every search stays cheap.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from families_for_tests import FAILS_ABOVE

import autotune
from autotune._apply import fp32 as _fp32
from autotune._cache.batch_answers import Answers
from autotune._cli import main
from autotune._families import Family
from autotune._lab.host.worker import Worker
from autotune._lab.protocol import MemoryProbeJob
from autotune._records import Candidate
from autotune._reports import MaxBatchReport

MIB = 2**20
CPU_FP32 = Candidate(device="cpu", precision="fp32")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the CPU's peak memory is read from /proc")


@pytest.fixture
def batched() -> str:
    autotune.register_family("batched", "families_for_tests:build_batched")
    return "batched"


def _job(batch_size: int, ref: str = "families_for_tests:build_batched") -> MemoryProbeJob:
    return MemoryProbeJob(family=Family("batched", ref), candidate=CPU_FP32, init_scale=None,
                          batch_size=batch_size, fp32=_fp32.current(), threads=torch.get_num_threads(),
                          sys_path=[p for p in sys.path if p])


def test_a_probe_after_a_larger_one_still_measures_what_it_needs() -> None:
    """The worker's allocator keeps freed memory; each probe must still see its own peak, in any order."""
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        small_first = worker.run_memory_probe(_job(8))
        large = worker.run_memory_probe(_job(64))
        small_again = worker.run_memory_probe(_job(8))
    peaks = [p.peak_bytes for p in (small_first, large, small_again)]
    assert all(p is not None for p in peaks), [p.failure for p in (small_first, large, small_again)]
    first, big, again = (p or 0 for p in peaks)
    # 64 x 256 x 128 fp32 inputs alone are 8 MiB; the activations several times that
    assert big > 4 * first > 0 and big > 8 * MIB
    assert 0.5 < again / first < 2, (first, again)
    assert small_first.free_bytes is not None and small_first.free_bytes > big


def test_max_batch_fits_the_limit_with_its_margin_and_the_line_is_sane(batched: str) -> None:
    report = autotune.max_batch_report(batched, device="cpu", precision="fp32", memory_limit_mb=48, margin=0.2)
    assert report.limit_bytes == 48 * MIB and report.limit_from == "memory_limit_mb"
    assert report.target_bytes == int(48 * MIB * 0.8)
    assert report.peak_bytes <= report.target_bytes
    assert report.probes[0].batch_size == 4 and report.probes[1].batch_size == 16
    fits = [p for p in report.probes if p.outcome == "fits"]
    assert report.batch_size == max(p.batch_size for p in fits)
    assert report.peak_bytes == next(p.peak_bytes for p in fits if p.batch_size == report.batch_size)
    line = report.line
    assert line is not None and line.batches == (4, 16)
    # about half a MiB of activations per sample; the model and its optimizer state are a fraction of a MiB
    assert 0.2 * MIB < line.per_sample_bytes < 2 * MIB
    assert abs(line.fixed_bytes) < 8 * MIB
    # extrapolated to the answer, the line is on the safe side, and not wildly (small batches need a little
    # more per sample: the confirmation steps refine it)
    assert 0.85 * report.peak_bytes <= line.predict(report.batch_size) < 2 * report.peak_bytes
    # and the answer is not far below what the limit allows
    assert report.peak_bytes >= 0.6 * report.target_bytes
    assert autotune.max_batch_size(batched, device="cpu", precision="fp32", memory_limit_mb=48,
                                   margin=0.2) == report.batch_size  # from the cache


def test_answers_are_cached_per_question_and_measured_again_when_forced(batched: str,
                                                                       isolated_autotune: Path) -> None:
    first = autotune.max_batch_report(batched, device="cpu", precision="fp32", memory_limit_mb=24)
    assert autotune.max_batch_report(batched, device="cpu", precision="fp32", memory_limit_mb=24) == first
    again = autotune.max_batch_report(batched, device="cpu", precision="fp32", memory_limit_mb=24, force=True)
    assert again.measured_at != first.measured_at
    cached = list((isolated_autotune / "max_batch").glob("*.json"))
    assert len(cached) == 1 and set(autotune.clear_cache()) >= {str(cached[0])}


def _answer(batch_size: int) -> MaxBatchReport:
    return MaxBatchReport(model_kind="batched", candidate=CPU_FP32, batch_size=batch_size, peak_bytes=MIB,
                          limit_bytes=2 * MIB, limit_from="memory_limit_mb", free_bytes=None, margin=0.15,
                          target_bytes=MIB, line=None, probes=[], measured_at="2026-01-01T00:00:00+00:00", wall_s=1.0)


def _symlink(path: Path) -> None:
    real = path.with_name("elsewhere.data")
    os.replace(path, real)
    path.symlink_to(real)


def _hundred_mb(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(100 * 2**20)  # sparse: 100 MB to the reader, no disk used


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)))


@pytest.mark.parametrize("damage", [_symlink, _hundred_mb, _garbage], ids=["symlink", "100-mb-file", "garbage"])
def test_an_answers_file_that_cannot_be_read_is_measured_again(damage: Callable[[Path], None],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Read like the results files: never through a link, never a file larger than any answers file."""
    answers = Answers("abc")
    answers.put("question", _answer(8))
    assert answers.get("question") == _answer(8)
    damage(answers.path)
    elsewhere = answers.path.with_name("elsewhere.data")
    linked_to = elsewhere.read_bytes() if elsewhere.exists() else None
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert answers.get("question") is None  # a miss: the caller measures
    assert "max-batch cache" in caplog.text and "measured again when asked for" in caplog.text
    answers.put("question", _answer(16))  # served in this process, never written through a link
    assert answers.get("question") == _answer(16)
    if linked_to is not None:  # a link is never overwritten, like a results file
        assert answers.path.is_symlink() and elsewhere.read_bytes() == linked_to
    else:  # a file that is no answers file is moved aside and replaced
        assert json.loads(answers.path.read_bytes())["reports"]["question"]["batch_size"] == 16
        assert len(list(answers.path.parent.glob("*.corrupt-*"))) == 1


@pytest.mark.parametrize(("build", "limit_mb"), [("build_oom_above", 512), ("build_killed_above", 64)],
                         ids=["raises-oom", "oom-killed"])
def test_the_search_backs_off_from_batches_that_run_out_of_memory(build: str, limit_mb: int) -> None:
    autotune.register_family("fragile", f"families_for_tests:{build}")
    report = autotune.max_batch_report("fragile", device="cpu", precision="fp32", memory_limit_mb=limit_mb)
    assert report.batch_size <= FAILS_ABOVE
    assert report.batch_size >= FAILS_ABOVE // 2
    failed = [p for p in report.probes if p.outcome == "oom"]
    assert failed and all(p.batch_size > FAILS_ABOVE and p.peak_bytes is None for p in failed)
    assert all(p.outcome == "fits" for p in report.probes if p.batch_size <= FAILS_ABOVE)


def test_a_limit_not_even_one_sample_fits_is_a_clear_error(batched: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")  # the probes run in this process: the same code
    with pytest.raises(autotune.MaxBatchError, match="batch of 1") as caught:
        autotune.max_batch_size(batched, device="cpu", precision="fp32", memory_limit_mb=0.25)
    assert caught.value.model_kind == "batched" and "memory_limit_mb" in str(caught.value)


def test_a_family_without_batch_size_is_a_clear_error(tiny_family: str) -> None:
    with pytest.raises(autotune.BatchSizeUnsupportedError, match="batch_size") as caught:
        autotune.max_batch_size(tiny_family, device="cpu", precision="fp32", memory_limit_mb=64)
    assert caught.value.ref == "families_for_tests:build_tiny"


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"margin": 1.0}, "margin"), ({"margin": -0.1}, "margin"), ({"memory_limit_mb": 0}, "memory_limit_mb"),
    ({"precision": "fp8"}, "precision"), ({"device": "tpu"}, "device"),
])
def test_bad_arguments_are_configuration_errors(batched: str, kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(autotune.ConfigurationError) as caught:
        autotune.max_batch_size(batched, **{"device": "cpu", "precision": "fp32", **kwargs})  # type: ignore[arg-type]
    assert caught.value.variable == name


def test_device_and_precision_default_to_the_best_config(batched: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")  # a short calibration: any pick will do
    config = autotune.best_config(batched)
    report = autotune.max_batch_report(batched, memory_limit_mb=24)
    assert report.candidate == config.candidate
    assert report.peak_bytes <= report.target_bytes


def test_cli_prints_the_answer_and_the_fitted_line(batched: str, capsys: pytest.CaptureFixture[str],
                                                   isolated_autotune: Path) -> None:
    assert main(["--max-batch", "batched", "--memory-limit-mb", "24"]) == 0
    out = capsys.readouterr().out
    assert " fits, peak " in out and "MiB x batch (fitted at batch 4 and 16)" in out
    assert main(["--max-batch", "batched", "--memory-limit-mb", "24", "--json"]) == 0  # the cached answer
    report = autotune.MaxBatchReport.model_validate_json(capsys.readouterr().out)
    assert f"batch {report.batch_size} fits" in out
    assert list((isolated_autotune / "max_batch").glob("*.json"))


def test_cli_max_batch_options_need_max_batch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--memory-limit-mb", "24"])
    assert exited.value.code == 2
