"""``autotune.trace`` / ``python -m autotune --trace``: the measured step under torch.profiler, in a worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import samples

import autotune
from autotune._apply import fp32 as _fp32
from autotune._cache.store import Store
from autotune._cli import main
from autotune._lab.protocol import TraceJob
from autotune._lab.trace import trace_candidate
from autotune._records import Candidate


def _measured(kind: str, isolated_autotune: Path) -> None:
    """Measurements for ``kind`` in the cache, bf16 clearly faster: the trace is the subject, not the calibration."""
    Store(isolated_autotune).save(autotune.fingerprint(), samples.family(
        kind, samples.timed("cpu", "fp32", 10.0), samples.timed("cpu", "bf16-mixed", 5.0)))


def _operator_names(trace_path: Path) -> list[str]:
    events = json.loads(trace_path.read_text())["traceEvents"]
    return [e["name"] for e in events if isinstance(e, dict) and "name" in e]


def test_cli_trace_of_a_named_candidate_writes_a_chrome_trace_and_prints_operators(
    isolated_autotune: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _measured("tiny_mlp", isolated_autotune)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--trace", "tiny_mlp", "--candidate", "cpu fp32", "--out", str(tmp_path / "traces")]) == 0
    out = capsys.readouterr().out
    assert "tiny_mlp on cpu fp32" in out and "top operators by self CPU time" in out and "aten::addmm" in out
    (trace_path,) = (tmp_path / "traces").glob("trace-tiny_mlp-cpu-fp32-*.json")
    names = _operator_names(trace_path)
    assert sorted(n for n in names if n.startswith("autotune step")) == [f"autotune step {i}" for i in range(5)]
    assert names.count("aten::addmm") == 3 * 5  # three Linear layers, five steps: the warm-up steps are not in it


def test_trace_runs_the_picked_configuration(isolated_autotune: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _measured("tiny_mlp", isolated_autotune)
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")  # the worker path is the test above
    report = autotune.trace("tiny_mlp", out_dir=tmp_path)
    assert report.candidate == autotune.best_config("tiny_mlp").candidate == Candidate(device="cpu",
                                                                                        precision="bf16-mixed")
    assert report.steps == 5 and report.warmup_steps == 3 and report.device_activity is None
    assert report.operators and report.operators[0].self_cpu_ms >= report.operators[-1].self_cpu_ms
    names = {op.name for op in report.operators}
    assert "aten::addmm" in _operator_names(Path(report.path))
    assert not any(name.startswith("autotune step") for name in names)


def test_an_unknown_candidate_lists_the_measured_ones(isolated_autotune: Path, tmp_path: Path) -> None:
    _measured("tiny_mlp", isolated_autotune)
    with pytest.raises(autotune.ConfigurationError, match="measured for tiny_mlp: cpu fp32, cpu bf16-mixed"):
        autotune.trace("tiny_mlp", out_dir=tmp_path, candidate="cpu fp33")


def test_a_candidate_that_crashes_under_the_profiler_is_a_trace_error(isolated_autotune: Path, tmp_path: Path) -> None:
    autotune.register_family("abort", "families_for_tests:build_abort")
    _measured("abort", isolated_autotune)
    with pytest.raises(autotune.TraceError, match="crashed: SIGABRT") as info:
        autotune.trace("abort", out_dir=tmp_path)
    assert info.value.candidate == "cpu bf16-mixed"
    assert "--explain abort" in str(info.value)


def test_an_output_directory_that_cannot_be_made_is_a_configuration_error(isolated_autotune: Path,
                                                                          tmp_path: Path) -> None:
    _measured("tiny_mlp", isolated_autotune)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(autotune.ConfigurationError, match="out_dir=.*a directory this user can write"):
        autotune.trace("tiny_mlp", out_dir=tmp_path / "a-file" / "traces")


def test_a_trace_the_profiler_could_not_write_is_an_error_not_a_report(tmp_path: Path) -> None:
    job = TraceJob(family=autotune.get_family("tiny_mlp"),
                   candidate=Candidate(device="cpu", precision="fp32"),
                   init_scale=None, path=str(tmp_path / "missing" / "trace.json"), warmup_steps=1, steps=1,
                   fp32=_fp32.current(), sys_path=[])
    with pytest.raises(OSError, match="could not write the trace"):
        trace_candidate(job)
