"""Real failing workloads in real worker processes: the host survives and classifies each one."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from procs_for_tests import workers_of
from samples import rival

import autotune
from autotune import CalibrationError
from autotune._answer import cached_families
from autotune._cache.store import Store
from autotune._lab.probe import probe_batch
from autotune._records import CandidateResult

TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize(
    ("build", "kind", "detail"),
    [
        pytest.param("build_abort", "crashed", "SIGABRT", id="abort"),
        pytest.param("build_segfault", "crashed", "SIGSEGV", id="segfault"),
        pytest.param("build_exit", "crashed", "worker exited with status 3", id="exit"),
        pytest.param("build_hang", "timeout", "made no progress", id="hang"),
        pytest.param("build_cpu_oom", "oom", "can't allocate memory", id="cpu-allocator-oom"),
        pytest.param("build_raise_oom", "oom", "OutOfMemoryError", id="torch-oom"),
        pytest.param("build_value_error", "error", "ValueError: labels have 3 classes", id="exception"),
    ],
)
def test_host_survives_and_classifies_each_failure(
    build: str, kind: str, detail: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CANDIDATE_TIMEOUT_S", "2")
    autotune.register_family("broken", f"families_for_tests:{build}")
    with pytest.raises(CalibrationError) as info:
        autotune.best_config("broken")
    label, why = info.value.failures[0]
    assert label == "cpu fp32"
    assert why.startswith(f"{kind}: ") and detail in why
    # The rest could not be verified without the fp32 reference, and say so.
    assert all("fp32 CPU reference failed" in why for _, why in info.value.failures[1:])
    # A failure of the fp32 CPU reference is never stored: the next call measures again.
    assert cached_families(["broken"]) == {}


def test_a_failed_reference_is_measured_again_by_the_next_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")  # an exception: no worker needed to show the rule
    autotune.register_family("broken", "families_for_tests:build_value_error")
    with caplog.at_level(logging.INFO, logger="autotune"):
        for _ in range(2):
            with pytest.raises(CalibrationError, match="labels have 3 classes"):
                autotune.best_config("broken")
    assert caplog.text.count("calibrating broken on this machine") == 2
    assert "nothing is stored, the next call measures again" in caplog.text
    assert cached_families(["broken"]) == {}


def test_crash_only_under_bf16_picks_fp32_and_names_the_crash() -> None:
    autotune.register_family("bf16_abort", "families_for_tests:build_abort_under_bf16")
    config = autotune.best_config("bf16_abort")
    assert config.precision in ("fp32", "fp16-mixed")
    bf16 = rival(config, "cpu bf16-mixed")
    assert bf16.verdict == "failed" and bf16.failure is not None
    assert bf16.failure.kind == "crashed" and "SIGABRT" in bf16.failure.detail
    measured = cached_families(["bf16_abort"])["bf16_abort"]
    by_label = {r.candidate.label: r for r in measured.candidates}
    assert by_label["cpu bf16-mixed"].failure is not None
    assert by_label["cpu fp32"].timing is not None  # measured again in the restarted worker


@pytest.mark.usefixtures("in_process")
def test_an_out_of_memory_error_is_retried_once_before_it_is_recorded() -> None:
    # The first bf16 step asks the real CPU allocator for 32 TiB: retried once, bf16 is measured.
    autotune.register_family("oom_once", "families_for_tests:build_cpu_oom_once_under_bf16")
    measured = autotune.calibrate(["oom_once"]).measurements["oom_once"]
    bf16 = next(r for r in measured.candidates if r.candidate.label == "cpu bf16-mixed")
    assert bf16.failure is None and bf16.numerics is not None


@pytest.mark.usefixtures("in_process")
def test_an_out_of_memory_set_up_is_retried_alone_and_the_others_are_built_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each precision's first step needs room for a workspace (then cached): fp16's runs out of memory next to
    # fp32 and bf16, fits with bf16 set aside (the fp32 baseline stays), and all three are timed together.
    import families_for_tests

    families_for_tests.WORKSPACE_CHOSEN.clear()  # in-process: this process's first steps
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    autotune.register_family("workspace", "families_for_tests:build_workspace_hungry")
    measured = autotune.calibrate(["workspace"]).measurements["workspace"]
    assert families_for_tests.WORKSPACE_CHOSEN == {"fp32", "torch.bfloat16", "torch.float16"}
    for result in measured.candidates:
        assert result.failure is None and result.timing is not None, (result.candidate.label, result.failure)


@pytest.mark.usefixtures("in_process")
def test_a_candidate_set_aside_that_no_longer_fits_keeps_its_measurements_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every build's first step needs room for a workspace: fp16 fits only with bf16 set aside, and bf16, built
    # again to be timed next to fp32 and fp16, no longer fits. It keeps its verification, with the failure.
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    autotune.register_family("workspace_every_build", "families_for_tests:build_workspace_hungry_every_build")
    measured = autotune.calibrate(["workspace_every_build"]).measurements["workspace_every_build"]
    by_label = {r.candidate.label: r for r in measured.candidates}
    bf16 = by_label["cpu bf16-mixed"]
    assert bf16.failure is not None and bf16.failure.kind == "oom" and bf16.numerics is not None
    assert "built again to be timed, next to cpu fp32, cpu fp16-mixed" in bf16.failure.detail
    assert by_label["cpu fp32"].usable and by_label["cpu fp16-mixed"].usable


@pytest.mark.usefixtures("in_process")
def test_a_candidate_out_of_memory_twice_says_so() -> None:
    autotune.register_family("oom", "families_for_tests:build_raise_oom")
    with pytest.raises(CalibrationError) as info:
        autotune.best_config("oom")
    label, why = info.value.failures[0]
    assert label == "cpu fp32" and why.startswith("oom: ") and "(2 attempts: again after freeing memory)" in why


def test_an_emulated_dtype_is_stopped_inside_its_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Six layers that take 0.4 s each under fp16 autocast (2.4 s a step): the limit (0.5 s) is checked at
    # every module, so fp16 stops after its second slow layer instead of finishing the step. In-process, so
    # this test can count the layers that ran. (Its build takes no batch_size: no probe before the step.)
    import families_for_tests

    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    autotune.register_family("emulated", "families_for_tests:build_emulated_fp16")
    families_for_tests.FP16_LAYERS_RUN["count"] = 0
    measured = autotune.calibrate(["emulated"]).measurements["emulated"]
    fp16 = next(r for r in measured.candidates if r.candidate.precision == "fp16-mixed")
    assert fp16.failure is not None and fp16.failure.kind == "too_slow"
    assert "into step 1" in fp16.failure.detail and "stopped inside the step" in fp16.failure.detail
    assert families_for_tests.FP16_LAYERS_RUN["count"] < 6


def test_an_emulated_kernel_is_stopped_by_a_probe_before_its_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # One kernel (uninterruptible: the deadline cannot stop inside it) of 100 ms a sample under fp16, 3 ms
    # otherwise: fp16's full step would take 3.2 s. A pass on 4 of the 32 samples is 33x fp32's, twice: fp16
    # is stopped without ever running the full batch; bf16, as fast as fp32, passes its probe.
    by_precision, batches = _one_slow_kernel(monkeypatch, "build_one_slow_fp16_kernel")
    fp16 = by_precision["fp16-mixed"]
    assert fp16.failure is not None and fp16.failure.kind == "too_slow", fp16.failure
    assert "pass on 4 of 32 samples" in fp16.failure.detail and "before a full step" in fp16.failure.detail
    assert batches == [4, 4]
    assert by_precision["bf16-mixed"].usable


def test_a_build_that_ignores_the_probe_batch_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its build takes batch_size= but returns 32 samples anyway: a "probe" would be full steps. The reference
    # pass sees that and probing stops; fp16's full step decides, as without a probe.
    by_precision, batches = _one_slow_kernel(monkeypatch, "build_one_slow_fp16_kernel_any_batch")
    fp16 = by_precision["fp16-mixed"]
    assert fp16.failure is not None and fp16.failure.kind == "too_slow", fp16.failure
    assert "before a full step" not in fp16.failure.detail
    assert batches == [32]


def test_a_probe_that_raises_leaves_the_classification_to_the_full_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 raises in its probe; the probe steps aside and the full step classifies the error as before.
    by_precision, batches = _one_slow_kernel(monkeypatch, "build_one_slow_fp16_kernel_no_bf16")
    bf16 = by_precision["bf16-mixed"]
    assert bf16.failure is not None and bf16.failure.kind == "unsupported", bf16.failure
    assert "not implemented for 'BFloat16'" in bf16.failure.detail
    assert by_precision["fp16-mixed"].failure is not None and batches == [4, 4]


def _one_slow_kernel(monkeypatch: pytest.MonkeyPatch, build: str) -> tuple[dict[str, CandidateResult], list[int]]:
    """Calibrate precisions of a family with one slow fp16 kernel, in-process: the results by precision, and
    the batch sizes its fp16 kernel ran at."""
    import families_for_tests

    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "1")
    autotune.register_family("one_slow_kernel", f"families_for_tests:{build}")
    families_for_tests.FP16_KERNEL_BATCHES.clear()
    measured = autotune.calibrate(["one_slow_kernel"]).measurements["one_slow_kernel"]
    return {r.candidate.precision: r for r in measured.candidates}, list(families_for_tests.FP16_KERNEL_BATCHES)


@pytest.mark.parametrize(("shapes", "batch"), [
    ([(32, 3, 64, 64), (32,)], 4), ([(16, 128), (16,)], 2), ([(64, 8)], 8),
    ([(16, 8)], 2), ([(15, 8), (15,)], None), ([(2, 8), (2,)], None),  # two passes would cost about a step
    ([(32, 8), (16,)], None), ([(32, 8), ()], None), ([], None),  # no single batch dimension
])
def test_probe_batch(shapes: list[tuple[int, ...]], batch: int | None) -> None:
    assert probe_batch(tuple(torch.zeros(shape) for shape in shapes)) == batch


def test_python_exception_is_classified_in_process_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    autotune.register_family("broken", "families_for_tests:build_value_error")
    with pytest.raises(CalibrationError, match="error: ValueError"):
        autotune.best_config("broken")


def _host(code: str, env: dict[str, str], **kwargs) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    prelude = (
        "import sys, json, logging, autotune; sys.path.insert(0, %r);"
        "logging.basicConfig(level=logging.INFO, format='%%(message)s');" % str(TESTS)
    )
    return subprocess.Popen([sys.executable, "-c", prelude + code], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_host_killed_mid_calibration_leaves_a_loadable_store(isolated_autotune: Path) -> None:
    env = {"AUTOTUNE_BUDGET_S": "30"}
    host = _host(
        "autotune.register_family('tiny', 'families_for_tests:build_tiny');"
        "autotune.register_family('slow', 'families_for_tests:build_slow');"
        "autotune.calibrate(['tiny', 'slow'])", env, start_new_session=True,
    )
    digest = autotune.fingerprint().digest
    path = isolated_autotune / f"{digest}.json"
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), host.communicate()[1]
    time.sleep(2)  # into the slow family's measurement
    os.killpg(host.pid, signal.SIGKILL)
    host.wait()
    stored = Store(isolated_autotune).load(digest)
    assert stored is not None and set(stored.families) == {"tiny"}
    assert list(isolated_autotune.glob("*.tmp")) == []


def test_single_flight_six_cold_processes_one_calibration(isolated_autotune: Path, tmp_path: Path) -> None:
    barrier = tmp_path / "go"
    code = (
        "import time, pathlib; p = pathlib.Path(%r);\n"
        "autotune.register_family('tiny', 'families_for_tests:build_tiny')\n"
        "while not p.exists(): time.sleep(0.01)\n"
        "print(autotune.best_config('tiny').model_dump_json())" % str(barrier)
    )
    hosts = [_host(code, {"AUTOTUNE_BUDGET_S": "1"}) for _ in range(6)]
    time.sleep(3)  # let all six import torch and reach the barrier
    barrier.touch()
    outputs = [host.communicate(timeout=240) for host in hosts]
    assert all(host.returncode == 0 for host in hosts), [err[-500:] for _, err in outputs]
    configs = {out.strip() for out, _ in outputs}
    assert len(configs) == 1  # identical answers, measured_at included
    calibrations = sum(line.startswith("calibrating tiny") for _, err in outputs for line in err.splitlines())
    assert calibrations == 1
    waited = sum("another process or job is calibrating tiny" in err for _, err in outputs)
    assert waited >= 1


def _hold_calibration_lock(cache: Path) -> subprocess.Popen[str]:
    digest = autotune.fingerprint().digest
    code = (
        "from autotune._cache.store import Store; import pathlib;"
        f"lock = Store(pathlib.Path({str(cache)!r})).calibration_lock({digest!r}, 'tiny'); lock.acquire();"
        "print('held', flush=True); import time; time.sleep(600)"
    )
    holder = _host(code, {})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_waiter_takes_over_when_the_lock_holder_dies(isolated_autotune: Path) -> None:
    holder = _hold_calibration_lock(isolated_autotune)
    waiter = _host(
        "autotune.register_family('tiny', 'families_for_tests:build_tiny');"
        "print(autotune.best_config('tiny').source)", {},
    )
    time.sleep(4)
    assert waiter.poll() is None  # still waiting for the holder
    holder.kill()
    holder.wait()
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert out.strip() == "measured"
    assert "another process or job is calibrating tiny" in err


def test_lock_wait_timeout_answers_heuristically(isolated_autotune: Path, tiny_family: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    holder = _hold_calibration_lock(isolated_autotune)
    seen: set[int] = set()  # worker processes of this one while it waited (read from /proc)
    waited = threading.Event()

    def watch() -> None:
        while not waited.is_set() and sys.platform.startswith("linux"):
            seen.update(workers_of(os.getpid()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    try:
        monkeypatch.setenv("AUTOTUNE_LOCK_TIMEOUT_S", "0.5")
        watcher.start()
        config = autotune.best_config(tiny_family)
    finally:
        waited.set()
        watcher.join()
        holder.kill()
        holder.wait()
    assert config.source == "heuristic"
    assert config.reason == ("fp32 on the CPU, which always trains: no measurement of this machine yet (another "
                             "process is still calibrating after AUTOTUNE_LOCK_TIMEOUT_S=0.5 s of waiting)")
    # Waiting for another process's result takes no worker (nor CPU from that process's measurement).
    assert seen == set()


def test_a_worker_that_cannot_start_is_said_as_such_not_blamed_on_the_family(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # the OS boundary: no interpreter to start
    with pytest.raises(autotune.WorkerStartError, match="no process could be started.*AUTOTUNE_ISOLATION=inprocess"):
        autotune.best_config(tiny_family)
