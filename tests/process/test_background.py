"""Background calibration: start_calibration returns a job; cancel leaves no worker, no lock, no torn file."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import filelock
import pytest
from procs_for_tests import alive, workers_of

import autotune
from autotune._answer import cached_families
from autotune._cache import lookup as _cached
from autotune._cache.locks import measuring_lock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for worker processes")


def _lock_free(kind: str) -> bool:
    lock = _cached.store().calibration_lock(autotune.fingerprint().digest, kind)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    lock.release()
    return True


def test_the_older_keyword_kinds_still_starts_the_job_with_a_deprecation_warning(tiny_family: str) -> None:
    """``model_kinds`` as ``calibrate`` names it; ``kinds=``, its name before, joins the same job and warns."""
    job = autotune.start_calibration(model_kinds=[tiny_family])
    with pytest.warns(DeprecationWarning, match=r"start_calibration\(model_kinds=\.\.\.\)"):
        assert autotune.start_calibration(kinds=[tiny_family]) is job
    with pytest.raises(TypeError, match="both model_kinds and kinds"):
        autotune.start_calibration([tiny_family], kinds=[tiny_family])
    assert tiny_family in job.wait(timeout=300).configs


def test_job_measures_in_the_background_and_a_second_start_joins_it(tiny_family: str) -> None:
    seen: list[tuple[str, str]] = []
    job = autotune.start_calibration([tiny_family],
                                     progress=lambda p: seen.append((p.family, threading.current_thread().name)))
    assert autotune.start_calibration([tiny_family]) is job
    during = autotune.best_config(tiny_family, wait=False)
    assert during.source == "heuristic" or job.done()
    if during.source == "heuristic":
        assert "calibration running" in during.reason.lower() and "fp32 on the CPU" in during.reason
    report = job.wait(timeout=300)
    assert job.done() and tiny_family in report.configs
    assert job.progress is not None and job.progress.fraction == 1.0
    assert seen and {thread for _, thread in seen} == {"autotune-calibration"}  # documented: the job's thread
    after = autotune.best_config(tiny_family, wait=False)
    assert after.source == "measured" and after == report.configs[tiny_family]
    again = autotune.start_calibration([tiny_family])
    assert again is not job  # a finished job is not joined
    first, second = report.measurements[tiny_family], again.wait(timeout=300).measurements[tiny_family]
    assert (second.measured_at != first.measured_at) == first.noisy  # a noisy result is measured again
    assert workers_of(os.getpid()) == []


@pytest.mark.usefixtures("in_process")
def test_a_job_measures_for_the_settings_it_started_with(tiny_family: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The app points the cache elsewhere after starting a job, before the job's thread runs: the job still
    # stores where it was started (the job is built, then its thread started, as start_calibration does).
    from autotune._background import CalibrationJob

    started_in = Path(os.environ["AUTOTUNE_CACHE_DIR"])
    job = CalibrationJob([autotune.get_family(tiny_family)], ("test",))
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("AUTOTUNE_SEARCH", "no such search")
    job._thread.start()
    report = job.wait(timeout=300)
    assert Path(report.store_path).parent == started_in
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.usefixtures("in_process")
def test_a_start_with_other_settings_is_another_job(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = autotune.start_calibration([tiny_family])
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.30")  # the same budget, spelt otherwise: the same job
    assert autotune.start_calibration([tiny_family]) is first or first.done()
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.2")
    second = autotune.start_calibration([tiny_family])
    assert second is not first
    measured = [job.wait(timeout=300).measurements[tiny_family] for job in (first, second)]
    assert [result.budget_s for result in measured] == [0.3, 0.2]  # each for its own settings, in turn
    monkeypatch.setenv("AUTOTUNE_SEARCH", "no such search")
    with pytest.raises(autotune.ConfigurationError, match="AUTOTUNE_SEARCH"):
        autotune.start_calibration([tiny_family])


def test_wait_with_a_timeout_says_the_job_goes_on(tiny_family: str) -> None:
    job = autotune.start_calibration([tiny_family])
    with pytest.raises(autotune.CalibrationPending, match="still running"):
        job.wait(timeout=0.001)
    job.cancel()
    with pytest.raises(autotune.CalibrationCancelled):
        job.wait(timeout=60)


def test_cancel_at_random_moments_keeps_finished_families_and_leaves_nothing(tiny_family: str) -> None:
    kinds = [tiny_family, "tiny_mlp"]
    rng = random.Random(12)
    pids: set[int] = set()  # every worker seen while a job ran
    for _ in range(3):
        job = autotune.start_calibration(kinds, progress=lambda p: pids.update(workers_of(os.getpid())))
        time.sleep(rng.uniform(0.0, 6.0))
        job.cancel()
        try:
            report = job.wait(timeout=60)
            finished = list(report.measurements)
        except autotune.CalibrationCancelled as cancelled:
            finished = cancelled.finished
            assert set(cancelled.finished) | set(cancelled.missing) == set(kinds)
        assert workers_of(os.getpid()) == [] and not any(alive(pid) for pid in pids)
        assert all(_lock_free(kind) for kind in kinds)
        stored = cached_families(kinds)
        assert set(finished) <= set(stored)
        for kind in stored:
            assert autotune.best_config(kind, wait=False).source == "measured"
    # The next job measures only the rest (and a family measured while the control drifted: noisy is
    # measured again by design).
    before = {kind: result.measured_at for kind, result in cached_families(kinds).items() if not result.noisy}
    report = autotune.start_calibration(kinds).wait(timeout=300)
    assert set(report.measurements) == set(kinds) and set(cached_families(kinds)) == set(kinds)
    assert all(report.measurements[kind].measured_at == at for kind, at in before.items())


def test_a_calibration_waits_while_something_else_measures_and_a_cancel_ends_the_wait(tiny_family: str) -> None:
    with measuring_lock():  # held here, as another process's calibration or --check would
        job = autotune.start_calibration([tiny_family])
        time.sleep(1.0)
        # It waits its turn, without starting a worker (an interpreter importing torch would slow the other).
        assert not job.done() and workers_of(os.getpid()) == []
        assert autotune.best_config(tiny_family, wait=False).source == "heuristic"
        job.cancel()
        with pytest.raises(autotune.CalibrationCancelled):
            job.wait(timeout=30)  # the wait ends with the cancel, not with the lock's 600 s timeout
    assert cached_families([tiny_family]) == {} and _lock_free(tiny_family)
    assert tiny_family in autotune.start_calibration([tiny_family]).wait(timeout=300).measurements


@pytest.mark.usefixtures("in_process")
def test_jobs_for_other_families_measure_one_after_the_other(tiny_family: str) -> None:
    autotune.register_family("tiny_twin", "families_for_tests:build_tiny")
    measuring: list[str] = []  # the family of every progress report during measurement, in order

    def seen(progress: autotune.CalibrationProgress) -> None:
        if progress.candidate is not None:
            measuring.append(progress.family)

    jobs = [autotune.start_calibration([kind], progress=seen) for kind in (tiny_family, "tiny_twin")]
    for job in jobs:
        job.wait(timeout=300)
    assert [kind for kind, _ in itertools.groupby(measuring)] in ([tiny_family, "tiny_twin"],
                                                                 ["tiny_twin", tiny_family])


def test_wait_false_sees_another_process_calibrating(tiny_family: str) -> None:
    lock = _cached.store().calibration_lock(autotune.fingerprint().digest, tiny_family)
    code = textwrap.dedent("""
        import time, autotune
        autotune.register_family("tiny", "families_for_tests:build_tiny")
        started = time.perf_counter()
        config = autotune.best_config("tiny", wait=False)
        print(config.source, time.perf_counter() - started, config.reason)
    """)
    with lock:  # held in this process, as a calibrating process would
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                             cwd=Path(__file__).parents[1], env=os.environ).stdout
    assert out.startswith("heuristic") and "calibration running in another process" in out.lower()
    assert cached_families([tiny_family]) == {}


def test_an_app_that_exits_mid_job_leaves_no_worker(isolated_autotune: Path) -> None:
    code = textwrap.dedent("""
        import os, sys, threading, autotune
        autotune.register_family("tiny", "families_for_tests:build_tiny")
        started = threading.Event()
        job = autotune.start_calibration(["tiny"], progress=lambda p: started.set())
        started.wait(120)
        print(os.getpid(), flush=True)
        sys.exit(0)  # the job is still running: atexit cancels it
    """)
    app = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).parents[1], env=os.environ)
    app_pid = int(app.stdout.split()[0])
    deadline = time.monotonic() + 10
    while workers_of(app_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers_of(app_pid) == []  # reparented workers would show another parent: check by command line too
    assert not any(b"autotune._lab.entry" in Path(f"/proc/{p}/cmdline").read_bytes() and
                   str(isolated_autotune).encode() in Path(f"/proc/{p}/environ").read_bytes()
                   for p in os.listdir("/proc") if p.isdigit() and _readable(p))
    assert _lock_free("tiny")


def _readable(pid: str) -> bool:
    try:
        Path(f"/proc/{pid}/environ").read_bytes()
        Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return True


def test_an_unusable_lock_directory_warns_once_and_measures_without_waiting(
    tiny_family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import tempfile

    from autotune._cache import locks as _locks

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_locks, "_warned", set())
    (tmp_path / f"autotune-{os.getuid()}").write_text("not a directory")  # squatted by a file
    with caplog.at_level("WARNING", logger="autotune"):
        assert measuring_lock() is None and measuring_lock() is None
        report = autotune.start_calibration([tiny_family]).wait(timeout=300)
    assert tiny_family in report.measurements
    warnings = [r.getMessage() for r in caplog.records if "cannot use the lock" in r.getMessage()]
    assert len(warnings) == 1 and "is a file, not a directory: move the file away;" in warnings[0]  # once, with why
