"""A result is flagged as measured on a busy machine only when something else took the machine: the worker's own
thread pools and its host's start-up do not count, another process does (the operating system names it), and a
noisy result is measured again once, not at every calibration.

Linux only: the evidence is read from /proc (elsewhere from psutil, where installed)."""

from __future__ import annotations

import hashlib
import importlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import autotune
from autotune._apply import fp32 as _fp32
from autotune._decide import picked
from autotune._families import get_family
from autotune._lab import load
from autotune._lab.load import MachineTimes, Window, _proc
from autotune._lab.step import TrainStep
from autotune._records import Candidate
from autotune.backends import backend_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: a process that keeps three threads hashing (hashlib lets go of the GIL): two cores' worth of demand
COMPETITOR = """
import hashlib, threading, time
def spin():
    data = b"x" * 2**22
    while True:
        hashlib.sha256(data).digest()
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
print("running", flush=True)
time.sleep(3600)
"""


@contextmanager
def competitor(name: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """A real competing process, busy from the moment this yields until it ends; ``name``: what it calls itself."""
    named = f"open('/proc/self/comm', 'w').write({name!r})\n" if name is not None else ""
    process = subprocess.Popen([sys.executable, "-c", named + COMPETITOR], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "running"
        yield process
    finally:
        process.kill()
        process.wait()


def test_the_control_waits_until_an_all_thread_candidates_pool_stops_spinning() -> None:
    if os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive" or (os.cpu_count() or 1) < 2:
        pytest.skip("OpenMP's pool does not spin here")
    torch.set_num_threads(2)  # the fixture restores it
    step = TrainStep(get_family("mlp"), Candidate(device="cpu", precision="fp32"), backend_for("cpu"), seed=0,
                     fp32_host=_fp32.current(), batch_size=64)
    step.run()
    assert _proc.threads_running(), "after its parallel regions the pool spin-waits: the control must not run now"
    load.settle(0.001)
    assert not _proc.threads_running()


def test_proc_is_read_whatever_a_process_calls_itself() -> None:
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice: busy is neither idle, iowait nor steal
    stat = "cpu  200 100 100 1000 50 30 20 50 0 0\ncpu0 100 50 50 500 25 15 10 25 0 0\nintr 12345\n"
    assert _proc.parse_machine(stat) == MachineTimes(steal_s=50 * tick_s, total_s=1550 * tick_s,
                                                     cpu_busy_s={0: 225 * tick_s})
    assert _proc.parse_machine("cpu  200 100 100 1000\ncpu0 200 100 100 1000\n") == MachineTimes(  # no steal column
        steal_s=0.0, total_s=1400 * tick_s, cpu_busy_s={0: 400 * tick_s})
    assert _proc.parse_machine("intr 12345\n") is None
    # The name sits between the first "(" and the last ")"; utime and stime are the 14th and 15th fields.
    line = b"4242 (tmux: (server) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 1661182 3133440 362"
    assert _proc.parse_process(line) == ("tmux: (server) 1", "S", 300 * tick_s)


@pytest.mark.parametrize("reader", ["_proc", "_psutil"], ids=["proc", "psutil"])
def test_a_competing_process_is_named_with_its_share_of_a_core(reader: str) -> None:
    if reader == "_psutil":
        pytest.importorskip("psutil")  # the reader where /proc is not there (macOS, Windows)
    source = importlib.import_module(f"autotune._lab.load.{reader}")
    with competitor() as busy:
        window = Window(source, host=None)
        threading.Event().wait(0.5)  # this process idles: what the machine did meanwhile was the others'
        seen = window.close()
        os.kill(busy.pid, signal.SIGSTOP)  # still there, taking nothing
        window = Window(source, host=None)
        threading.Event().wait(0.5)
        stopped = window.close()
    assert seen is not None and seen.other_cores is not None and seen.other_cores > 0
    named = {p.pid: p.cores for p in seen.processes}
    assert named.get(busy.pid, 0.0) > 0, seen.processes
    assert stopped is not None and busy.pid not in {p.pid for p in stopped.processes}
    assert os.getpid() not in {*named, *(p.pid for p in stopped.processes)}  # the worker's own time is not another's


@pytest.mark.parametrize("reader", ["_proc", "_psutil"], ids=["proc", "psutil"])
def test_a_process_that_names_itself_with_escape_sequences_is_named_printably(
        reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Any user may name a process (15 bytes of anything but NUL), and a noisy result's reason names the busiest.
    if reader == "_psutil":
        pytest.importorskip("psutil")
    source = importlib.import_module(f"autotune._lab.load.{reader}")
    monkeypatch.setattr(load, "PROCESSES_NAMED", 10**6)  # every process, however little of a core the machine's
    monkeypatch.setattr(load, "PROCESS_FLOOR_CORES", 0.0)  # load leaves it: its name is the subject, not its share
    with competitor(name="\x1b[2J\rbusy\x07") as busy:
        window = Window(source, host=None)
        threading.Event().wait(0.5)
        seen = window.close()
    assert seen is not None
    assert {p.pid: p.name for p in seen.processes}.get(busy.pid) == "[2J busy", seen.processes


def test_a_jobs_copies_of_the_timed_step_are_the_workers_own_time_not_another_process() -> None:
    # A job of many processes times each CPU candidate with copies of its step running beside it by design: their
    # CPU time must not flag the machine as busy. Two windows over the same half second, one counting the copy.
    watch = load.Watch(host=None)
    with competitor() as copy:
        plain = watch.open()
        with watch.counting([copy.pid]):
            counted = watch.open()
        threading.Event().wait(0.5)
        seen, seen_counted = plain.close(), counted.close()
    assert seen is not None and seen_counted is not None
    assert seen.other_cores is not None and seen_counted.other_cores is not None
    assert seen.other_cores - seen_counted.other_cores > 0.1  # the copy's cores left out of the others'
    assert copy.pid in {p.pid for p in seen.processes}
    assert copy.pid not in {p.pid for p in seen_counted.processes}
    assert watch.open().mine == ()  # after the block, a window counts the worker alone again


def test_timing_waits_until_the_host_is_done_with_its_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host (this process) keeps a core busy for a while after the worker starts setting up, as a host still
    # importing or an app still building its model does: no timing window may overlap it. Steps of 10 ms at least:
    # a sub-millisecond family's stages can all end under the shortest window the OS reads, leaving nothing to check.
    autotune.register_family("steady", "families_for_tests:build_steady")
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "3")
    done = threading.Event()

    def start_up() -> None:
        data = b"x" * 2**22
        while not done.is_set():
            hashlib.sha256(data).digest()

    def progress(_: autotune.CalibrationProgress) -> None:
        if not timer.is_alive() and not done.is_set():
            timer.start()

    timer = threading.Timer(4.0, done.set)
    threading.Thread(target=start_up, daemon=True).start()
    try:
        measured = autotune.calibrate(["steady"], progress=progress).measurements["steady"]
    finally:
        done.set()
        timer.cancel()
    assert measured.loads, "no window long enough to read"
    assert all(w.host_cores is not None and w.host_cores < load.HOST_QUIET_CORES for w in measured.loads), (
        measured.host_wait_s, measured.loads)


def test_a_noisy_result_is_measured_again_once_then_kept(tiny_family: str, in_process: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.6")
    with competitor():
        first = autotune.calibrate([tiny_family]).measurements[tiny_family]
        assert first.noisy and "other_processes" in first.noisy_because
        second = autotune.calibrate([tiny_family]).measurements[tiny_family]
        third = autotune.calibrate([tiny_family]).measurements[tiny_family]
    assert second.measured_at != first.measured_at and second.after_noisy == picked(first)
    assert third == second  # kept, noisy or not: one automatic re-measurement for its noise
    config = autotune.best_config(tiny_family)
    assert config.evidence is not None and config.evidence.after_noisy == picked(first)
    assert "measures it again" not in config.reason
