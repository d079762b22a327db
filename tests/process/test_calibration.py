"""Real calibrations in real worker processes: the healthy path, the cache, and progress."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from samples import family, timed

import autotune
from autotune._answer import cached_configs, cached_families
from autotune._cache import lookup as _cached
from autotune._cache.store import Store
from autotune._calibrate import CalibrationProgress
from autotune._cli import main
from autotune._wording import ratio_words


def test_end_to_end_calibration_of_builtin_tiny_mlp(isolated_autotune: Path) -> None:
    config = autotune.best_config("tiny_mlp")
    assert config.source == "measured"
    assert config.device == "cpu"
    assert config.precision in ("fp32", "bf16-mixed", "fp16-mixed")
    assert config.step_ms is not None and config.step_ms > 0
    assert config.fingerprint_digest == autotune.fingerprint().digest
    assert " on the CPU: " in config.reason and len(config.reason) <= 160
    stored = Store(isolated_autotune).load(config.fingerprint_digest)
    assert stored is not None
    measured = stored.families["tiny_mlp"]
    labels = [r.candidate.label for r in measured.candidates]
    assert labels[0] == "cpu fp32" and "cpu bf16-mixed" in labels
    # Every other candidate of the record is in the evidence: with its ratio, interval and rounds, or why it stopped.
    assert config.evidence is not None and config.evidence.device_name
    rivals = {r.candidate.label: r for r in config.evidence.rivals}
    assert set(rivals) == set(labels) - {config.candidate.label}
    for result in measured.candidates:
        if result.candidate == config.candidate:
            continue
        found = rivals[result.candidate.label]
        if result.failure is not None:
            assert (found.verdict, found.failure) == ("failed", result.failure)
        else:
            assert found.ratio is not None and found.against is not None and found.rounds is not None
            assert found.verdict != "untimed" and found.step_ms == result.timing.mean_ms  # type: ignore[union-attr]
        if result.timing is not None and result.timing.dropped is not None:
            assert (found.verdict, found.ratio, found.rounds) == (
                "dropped", result.timing.dropped.ratio, result.timing.dropped.rounds)
    baseline = measured.candidates[0]
    assert baseline.timing is not None
    assert baseline.timing.n >= 3 or baseline.timing.dropped is not None  # timed to a verdict, or far behind
    assert baseline.numerics is not None and baseline.numerics.loss_error == 0.0
    assert baseline.num_threads is not None and baseline.setup_s is not None
    if sys.platform == "linux":  # the worker's peak resident size, reset per candidate (issue #15)
        assert all(r.peak_bytes is not None and r.peak_bytes > 0 for r in measured.candidates if r.failure is None)
        assert config.peak_memory_mb is not None and config.peak_memory_mb > 0
    # Every backend that offered no candidate says why; CPU always offers one.
    assert "cpu" not in measured.backend_notes and all(measured.backend_notes.values())
    planned_backends = {r.candidate.device.split(":")[0] for r in measured.candidates}
    assert planned_backends.isdisjoint(measured.backend_notes)


def test_a_second_process_is_answered_from_the_cache(tiny_family: str, isolated_autotune: Path) -> None:
    first = autotune.best_config(tiny_family)
    code = (
        "import sys, autotune; sys.path.insert(0, sys.argv[1]);"
        "autotune.register_family('tiny', 'families_for_tests:build_tiny');"
        "print(autotune.best_config('tiny', calibrate_on_miss=False).model_dump_json())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[1])],
                         capture_output=True, text=True, check=True).stdout
    again = autotune.Config.model_validate_json(out)
    assert again.source == "measured"
    assert again == first


@pytest.mark.usefixtures("in_process")
def test_repeated_calls_in_a_process_reuse_the_decision(tiny_family: str) -> None:
    assert autotune.best_config(tiny_family) is autotune.best_config(tiny_family)


@pytest.mark.usefixtures("in_process")
def test_a_write_by_another_process_is_noticed(tiny_family: str, isolated_autotune: Path) -> None:
    before = autotune.best_config(tiny_family)
    autotune.calibrate([tiny_family], force=True)
    after = autotune.best_config(tiny_family)
    assert after.measured_at != before.measured_at


@pytest.mark.usefixtures("in_process")
def test_calibrate_reports_monotonic_progress(tiny_family: str) -> None:
    events: list[CalibrationProgress] = []
    report = autotune.calibrate([tiny_family, "tiny_mlp"], progress=events.append)
    fractions = [e.fraction for e in events]
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0
    assert {e.family for e in events} == {tiny_family, "tiny_mlp"}
    assert {e.candidate for e in events if e.candidate} >= {"cpu fp32", "cpu bf16-mixed"}
    assert set(report.configs) == {tiny_family, "tiny_mlp"}
    assert Path(report.store_path).exists()


@pytest.mark.usefixtures("in_process")
def test_calibrate_reuses_cached_families_unless_forced(tiny_family: str) -> None:
    first = autotune.calibrate([tiny_family]).measurements[tiny_family]
    again = autotune.calibrate([tiny_family]).measurements[tiny_family]
    # A result measured while the control drifted (a busy machine) is measured again; a steady one is served.
    assert (again.measured_at != first.measured_at) if first.noisy else (again == first)
    assert autotune.calibrate([tiny_family], force=True).measurements[tiny_family].measured_at != first.measured_at


def test_calibrate_rejects_unknown_names_before_measuring(isolated_autotune: Path) -> None:
    with pytest.raises(autotune.UnknownFamilyError):
        autotune.calibrate(["tiny_mlp", "cnm"])
    assert cached_families() == {}


@pytest.mark.usefixtures("in_process")
def test_calibrate_on_miss_false_answers_heuristically(tiny_family: str) -> None:
    config = autotune.best_config(tiny_family, calibrate_on_miss=False)
    assert (config.source, config.device, config.precision) == ("heuristic", "cpu", "fp32")
    assert config.reason == ("fp32 on the CPU, which always trains: no measurement of this machine yet (calibration "
                             "not allowed by calibrate_on_miss=False)")
    assert config.evidence is not None
    assert config.evidence.unmeasured == "calibration not allowed by calibrate_on_miss=False"


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize(("prefer", "steps"), [("cpu", None), ("auto", 10), ("gpu", 100)])
def test_preferences_and_short_jobs_need_no_new_measurement(tiny_family: str, prefer: str, steps: int | None) -> None:
    measured_at = autotune.best_config(tiny_family).measured_at
    config = autotune.best_config(tiny_family, prefer=prefer, expected_steps=steps)  # type: ignore[arg-type]
    assert config.measured_at == measured_at and config.device == "cpu"


@pytest.mark.usefixtures("in_process")
def test_prefer_gpu_on_this_cpu_only_machine_says_there_is_no_usable_gpu(tiny_family: str) -> None:
    config = autotune.best_config(tiny_family, prefer="gpu")
    assert config.device == "cpu"
    assert "GPU requested, but there is no usable GPU" in config.reason
    assert config.evidence is not None and config.evidence.no_gpu is not None
    assert config.evidence.no_gpu.startswith("there is no usable GPU (cuda: ")


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"prefer": "tpu"}, "prefer"), ({"expected_steps": 0}, "expected_steps"),
    ({"expected_steps": 2.5}, "expected_steps"),
])
def test_bad_arguments_are_clear_errors(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(autotune.ConfigurationError, match=name):
        autotune.best_config("tiny_mlp", **kwargs)  # type: ignore[arg-type]


def test_inprocess_isolation_measures_the_same_way(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    config = autotune.best_config(tiny_family)
    assert config.source == "measured"


@pytest.mark.usefixtures("in_process")
def test_forced_device_from_the_environment(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_DEVICE", "cpu")
    config = autotune.best_config(tiny_family)
    assert (config.device, config.source) == ("cpu", "forced")


@pytest.mark.parametrize(("variable", "value"), [
    ("AUTOTUNE_ISOLATION", "forkk"), ("AUTOTUNE_DEVICE", "tpu"), ("AUTOTUNE_BUDGET_S", "-1"),
    ("AUTOTUNE_CANDIDATE_TIMEOUT_S", "soon"),
])
def test_invalid_environment_is_an_error_naming_the_variable(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(autotune.ConfigurationError, match=variable):
        autotune.calibrate([tiny_family], force=True)


@pytest.mark.parametrize(("variable", "value"), [("AUTOTUNE_ISOLATION", "thread"), ("AUTOTUNE_SEARCH", "all")])
def test_a_setting_only_measuring_reads_is_refused_even_when_the_cache_answers(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    _cached.store().save(autotune.fingerprint(), family(tiny_family, timed("cpu", "fp32", 100.0)))
    assert autotune.best_config(tiny_family).source == "measured"
    monkeypatch.setenv(variable, value)
    with pytest.raises(autotune.ConfigurationError, match=f"{variable}='{value}' is invalid: expected"):
        autotune.best_config(tiny_family)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps", "xpu", "gpu"])
def test_a_device_this_process_cannot_use_is_refused_at_once_naming_what_it_can(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    monkeypatch.setenv("AUTOTUNE_DEVICE", device)
    with pytest.raises(autotune.ConfigurationError, match=rf"AUTOTUNE_DEVICE='{device}' is invalid: .*"
                       r"\(.+\); this process can use: cpu$"):
        autotune.best_config(tiny_family)
    assert main(["--family", tiny_family]) == 1  # before measuring anything
    assert "AUTOTUNE_DEVICE=" in capsys.readouterr().err and cached_families([tiny_family]) == {}


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "CPU"])
def test_cpu_0_is_the_cpu_and_keeps_the_measured_pick(tiny_family: str, monkeypatch: pytest.MonkeyPatch,
                                                      device: str) -> None:
    _cached.store().save(autotune.fingerprint(), family(
        tiny_family, timed("cpu", "bf16-mixed", 50.0), timed("cpu", "fp32", 100.0)))
    monkeypatch.setenv("AUTOTUNE_DEVICE", device)
    config = autotune.best_config(tiny_family)
    assert (config.device, config.precision, config.source) == ("cpu", "bf16-mixed", "forced")
    assert config.reason.startswith("bf16 mixed precision on the CPU: forced by AUTOTUNE_DEVICE=cpu;")


@pytest.mark.parametrize(("prefer", "device"), [
    ("gpu", "cuda:0"), ("cuda", "cuda:0"), ("xpu", "cpu"), ("mps", "cpu"), ("cpu", "cpu"), ("auto", "cpu"),
])
def test_prefer_takes_the_device_words_of_autotune_device(tiny_family: str, prefer: str, device: str) -> None:
    """A machine measured with a CUDA GPU that ties the CPU: a backend's name in ``prefer`` means that backend's
    GPU, as ``gpu`` means any; one this machine does not have answers the CPU and says so."""
    _cached.store().save(autotune.fingerprint(), family(
        tiny_family, timed("cuda:0", "bf16-mixed", 50.0), timed("cpu", "bf16-mixed", 50.0)))
    config = autotune.best_config(tiny_family, prefer=prefer)  # type: ignore[arg-type]
    assert config.device == device
    assert ("GPU requested, but" in config.reason) == (prefer in ("xpu", "mps"))
    assert main(["--family", tiny_family, "--prefer", prefer]) == 0


@pytest.mark.usefixtures("in_process")
def test_empty_environment_values_mean_unset(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_DEVICE", "")
    assert autotune.best_config(tiny_family).source == "measured"


def test_import_autotune_loads_torch_only_when_a_public_name_is_used() -> None:
    """``python -m autotune`` starts its worker before the host imports torch: the package loads lazily."""
    code = ("import sys, autotune; assert 'torch' not in sys.modules, 'torch imported'; "
            "names = [n for n in autotune.__all__ if getattr(autotune, n) is None]; assert not names, names; "
            "assert set(autotune.__all__) <= set(dir(autotune)); assert 'torch' in sys.modules; "
            "from autotune import Config, best_config")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(AttributeError, match="no attribute 'best_confg'"):
        autotune.best_confg  # noqa: B018


def test_no_numpy_warning_from_torch_where_autotune_loads_it() -> None:
    """Without numpy, importing torch warns "Failed to initialize NumPy": not because of autotune, whether torch
    loads at the first public name (after the filters ``import autotune`` set were restored, as a
    ``catch_warnings`` block around the import does) or in the worker."""
    no_numpy = "import sys, warnings; sys.modules['numpy'] = None\n"  # numpy not installed, as torch sees it
    host = no_numpy + "with warnings.catch_warnings():\n    import autotune\nautotune.Config"  # filters restored
    worker = no_numpy + ("import os, runpy; sys.argv[1:] = [str(os.getppid())]; "
                         "runpy.run_module('autotune._lab.entry', run_name='__main__')")
    control = subprocess.run([sys.executable, "-c", no_numpy + "import torch"], capture_output=True, text=True)
    assert "Failed to initialize NumPy" in control.stderr  # the test's way of hiding numpy does provoke it
    for code in (host, worker):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0 and "NumPy" not in proc.stderr, proc.stderr


def test_cli_json_in_a_subprocess(isolated_autotune: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "--family", "tiny_mlp", "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["fingerprint"]["digest"] == autotune.fingerprint().digest
    config = autotune.Config.model_validate(data["configs"]["tiny_mlp"])
    assert config.source == "measured"
    assert config.evidence is not None and config.evidence.rivals  # the argument as data, read back by the model
    assert config.evidence.model_dump(mode="json") == data["configs"]["tiny_mlp"]["evidence"]
    assert "NumPy" not in proc.stderr


def test_cli_usage_error_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune", "--steps", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--steps" in proc.stderr


def test_cli_version_answers_before_anything_loads_torch() -> None:
    # -X importtime lists on stderr every module the process imports; no pydantic either: an installed package's
    # --version answers with no dependency at all, and the early worker start waits for nothing heavy
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "autotune", "--version"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stdout == f"autotune {autotune.__version__} (torch-autotune-device)\n"
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "autotune._args" in imported and not {"torch", "pydantic"} & imported


def test_cli_unknown_family_exits_1_with_suggestion() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune", "--family", "cnm"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "did you mean 'cnn'?" in proc.stderr


@pytest.mark.usefixtures("in_process")
def test_cli_explain_lists_every_candidate_with_its_outcome(tiny_family: str, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune._cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--explain", tiny_family]) == 0
    out = capsys.readouterr().out
    assert "cpu fp32" in out and "cpu bf16-mixed" in out
    assert "stage 2:" in out and "final" in out
    config = cached_configs([tiny_family])[tiny_family]
    assert f"decision: {config.reason}\n" in out
    # Every other candidate on a line of its own: its verdict, ratio, interval and rounds, or its failure.
    assert config.evidence is not None and config.evidence.rivals
    for rival in config.evidence.rivals:
        cells = [rival.candidate.label, rival.verdict]
        if rival.failure is not None:
            cells += ["-", "-", "-", f"{rival.failure.kind} (above)"]
        else:
            assert rival.ratio is not None and rival.rounds is not None
            interval = "-" if rival.far_behind else f"{rival.ratio.low:.2f}-{rival.ratio.high:.2f}" \
                if rival.ratio.high != float("inf") else "unpaired"
            cells += [ratio_words(rival.ratio.estimate), interval, str(rival.rounds)]
        assert re.search("^" + " +".join(map(re.escape, cells)), out, re.MULTILINE), (cells, out)
    # --prefer and --steps decide as the table would, and say what was asked for.
    assert main(["--explain", tiny_family, "--prefer", "gpu", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "asked for: prefer=gpu, expected_steps=60" in out
    if not autotune.fingerprint().accelerators:
        assert "GPU requested, but there is no usable GPU (" in out


@pytest.mark.usefixtures("in_process")
def test_cli_table_and_doctor_in_process(tiny_family: str, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune._cli import main

    assert main(["--family", tiny_family]) == 0
    out = capsys.readouterr().out
    assert "Machine" in out and tiny_family in out and "measured" in out
    # Last, the reason, worded to the console's width (120 in a pipe without COLUMNS)
    assert " ".join(out.split()).endswith(f"{tiny_family}: {autotune.best_config(tiny_family).reason}")
    assert main(["--doctor"]) == 0
    doctor = capsys.readouterr().out
    assert doctor.strip()
    if not any(a for a in autotune.fingerprint().accelerators):
        assert "no usable GPU on this machine" in doctor
    assert main(["--clear"]) == 0
    assert cached_families() == {}
