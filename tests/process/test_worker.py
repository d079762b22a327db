"""One worker per calibration, and a worker that never outlives its host (real processes, real signals)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs_for_tests import SETTINGS, alive

import autotune
from autotune._families import get_family
from autotune._lab.host.worker import Worker
from autotune._lab.measure import MeasureSettings
from autotune._lab.protocol import CalibrationSettings

TESTS = Path(__file__).parents[1]




def test_one_worker_measures_every_family_in_turn() -> None:
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    autotune.register_family("tiny_cnn", "families_for_tests:build_tiny_cnn")
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        worker.start()
        first = worker.run_family(get_family("tiny"), SETTINGS)
        second = worker.run_family(get_family("tiny_cnn"), SETTINGS)
        assert worker.starts == 1
        pid = worker.pid
    assert pid is not None and not alive(pid)  # closed with the calibration
    assert all(r.usable for r in first.candidates if r.candidate.precision == "fp32")
    assert second.worker_start_s == 0.0 and any(r.usable for r in second.candidates)


def test_a_crash_restarts_the_worker_for_the_rest_and_the_next_family() -> None:
    autotune.register_family("abort_bf16", "families_for_tests:build_abort_under_bf16")
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        crashed = worker.run_family(get_family("abort_bf16"), SETTINGS)
        after = worker.run_family(get_family("tiny"), SETTINGS)
        assert worker.starts == 2
    failure = next(r.failure for r in crashed.candidates if r.candidate.precision == "bf16-mixed")
    assert failure is not None and failure.kind == "crashed"
    assert any(r.usable for r in after.candidates)


def test_a_worker_restarted_after_a_crash_goes_on_with_the_staged_search() -> None:
    # channels_last aborts the process in stage 2; the restarted worker resumes after stage 1 without it, so
    # the later stage (fewer CPU threads) is still tried, and the crash is recorded once.
    autotune.register_family("abort_cl", "families_for_tests:build_abort_under_channels_last")
    settings = CalibrationSettings(measure=MeasureSettings(budget_s=0.2))
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        result = worker.run_family(get_family("abort_cl"), settings)
        assert worker.starts >= 2
    by_label = {r.candidate.label: r for r in result.candidates}
    crashed = [r for r in result.candidates if r.failure is not None and r.failure.kind == "crashed"]
    assert crashed and all(r.candidate.memory_format == "channels_last" for r in crashed)
    assert len(crashed) == worker.starts - 1  # each one once: a restarted worker does not try it again
    assert all("_abort_under_channels_last" in (r.failure.detail if r.failure else "") for r in crashed)
    assert any(r.candidate.num_threads == 1 and r.timing is not None for r in result.candidates)
    assert by_label["cpu fp32"].timing is not None
    assert any(note.startswith("resumed after stage 1 in a restarted worker") for note in result.search_notes)


HOST = textwrap.dedent("""
    import sys
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, as in a terminal, wherever the tests run
    sys.path.insert(0, {tests!r})
    import autotune
    from autotune._lab.measure import MeasureSettings
    from autotune._lab.protocol import CalibrationSettings
    from autotune._lab.host.worker import Worker
    from autotune._families import get_family

    autotune.register_family("hang", "families_for_tests:build_hang")
    worker = Worker(isolation="subprocess", timeout_s=600)
    worker.start()
    print(worker.pid, flush=True)
    try:
        worker.run_family(get_family("hang"), CalibrationSettings(search="precision"))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def _host_with_a_hung_worker() -> tuple[subprocess.Popen[str], int]:
    host = subprocess.Popen([sys.executable, "-c", HOST.format(tests=str(TESTS))], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    pid = int(host.stdout.readline())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the worker is busy in the hung candidate once its verification began
        children = Path(f"/proc/{pid}/task/{pid}/children")
        if alive(pid) and Path(f"/proc/{pid}/stat").exists() and children.exists():
            status = Path(f"/proc/{pid}/status").read_text()
            if "State:\tS" in status and _cpu_seconds(pid) > 1.0:  # imported torch, now asleep in the step
                break
        time.sleep(0.2)
    return host, pid


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_dies_with_its_killed_host() -> None:
    host, pid = _host_with_a_hung_worker()
    host.send_signal(signal.SIGKILL)
    host.wait()
    deadline = time.monotonic() + 2.0
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_the_worker_entry_imports_nothing_heavy_before_it_is_tied_to_its_host() -> None:
    code = ("import sys, autotune._lab.entry; "
            "assert not {'torch', 'pydantic', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


HOST_OF_A_STARTING_WORKER = textwrap.dedent("""
    import sys
    from autotune._lab.host import launch

    tree = launch.ProcessTree(launch.worker_argv())
    print(tree.proc.pid, flush=True)
    sys.stdin.readline()
""")


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_still_importing_torch_dies_with_its_killed_host() -> None:
    """A host killed in its worker's first seconds (``import torch`` takes several) leaves no worker behind."""
    host = subprocess.Popen([sys.executable, "-c", HOST_OF_A_STARTING_WORKER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    pid = int(host.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while alive(pid) and "/torch/lib/" not in _maps(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "/torch/lib/" in _maps(pid), "the worker never began importing torch"
        host.send_signal(signal.SIGKILL)
        host.wait()
        time.sleep(1.0)
        assert not alive(pid)
    finally:
        host.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupted_host_kills_its_worker_before_going_on() -> None:
    host, pid = _host_with_a_hung_worker()
    host.send_signal(signal.SIGINT)
    out, _ = host.communicate(timeout=30)
    assert "interrupted" in out
    assert not alive(pid)


API_HOST = textwrap.dedent("""
    import sys
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, as in a terminal, wherever the tests run
    sys.path.insert(0, {tests!r})
    import autotune

    autotune.register_family("hang", "families_for_tests:build_hang")
    try:
        autotune.best_config("hang")  # under the family's calibration lock
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()  # the test looks at the worker and the lock meanwhile
    autotune.register_family("hang", "families_for_tests:build_tiny")  # the same family, so the same lock
    print(autotune.best_config("hang").source, flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interrupted_calibration_frees_its_lock_and_the_next_one_runs_alone(isolated_autotune: Path) -> None:
    import filelock

    env = {**os.environ, "AUTOTUNE_LOCK_TIMEOUT_S": "1"}  # a lock still held would answer "heuristic" at once
    host = subprocess.Popen([sys.executable, "-c", API_HOST.format(tests=str(TESTS))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert host.stdin is not None and host.stdout is not None
    try:
        worker = _worker_in_a_hung_step(host.pid)
        host.send_signal(signal.SIGINT)
        assert host.stdout.readline().strip() == "interrupted"
        assert not alive(worker), "the worker was killed before the host went on"
        (lock_path,) = isolated_autotune.glob("*.hang.calibrating.lock")
        lock = filelock.FileLock(lock_path)
        lock.acquire(timeout=0)  # free: raises Timeout if the interrupted calibration still held it
        lock.release()
        host.stdin.write("\n")
        host.stdin.flush()
        assert host.stdout.readline().strip() == "measured", "the next calibration ran, without waiting"
        assert host.wait(timeout=120) == 0
    finally:
        host.kill()


def _worker_in_a_hung_step(host_pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = Path(f"/proc/{host_pid}/task/{host_pid}/children").read_text().split()
        if children and alive(pid := int(children[0])):
            status = Path(f"/proc/{pid}/status").read_text()
            if "State:\tS" in status and _cpu_seconds(pid) > 1.0:  # imported torch, now asleep in the step
                return pid
        time.sleep(0.2)
    raise AssertionError("the worker never reached the hung step")
