from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from reasons_for_tests import one_sentence_problem

import autotune
from autotune import _wording
from autotune._apply import fp32 as _fp32
from autotune.testing import reset_state


@pytest.fixture(autouse=True)
def isolated_autotune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test gets its own cache dir, no inherited AUTOTUNE_* settings, a small budget, fresh state (memos,
    registered families, background jobs: a job still running would go on in the next test's cache dir)."""
    for name in list(os.environ):
        if name.startswith("AUTOTUNE_"):
            monkeypatch.delenv(name)
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(cache))
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.3")
    reset_state()
    threads = torch.get_num_threads()
    with _fp32.preserved():  # an in-process candidate, a framework or a test may switch them: put them back
        yield cache
    reset_state()
    torch.set_num_threads(threads)


class ProcessStarted(BaseException):
    """A test of a tier that starts no process started one (BaseException: no ``except Exception`` swallows it)."""


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Creating a process fails loudly, at the OS boundary: ``subprocess.Popen`` (and so ``run``, ``os.popen``,
    ``asyncio``), ``os.fork``, ``posix_spawn``, ``system``, ``spawn*``, and a ``multiprocessing`` start. Autouse in the
    tiers that start none (tests/unit, tests/sim), so they stay fast: a test that needs a process belongs further on.
    Yields what was attempted; the test fails on the first attempt, even one the code under test catches."""
    attempted: list[str] = []

    def refused(what: str) -> Callable[..., object]:
        def start(*args: object, **kwargs: object) -> object:
            attempted.append(what)
            raise ProcessStarted(f"{what}: a test in this tier starts no process (move it to a later tier)")
        return start

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused("subprocess.Popen"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe", "startfile"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refused(f"os.{name}"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused("multiprocessing"))
    yield attempted
    assert not attempted, f"processes started in a tier that starts none: {attempted}"


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates run in this process: for tests whose subject is not the worker process (a calibration then
    takes about 1 s here instead of the 4-5 s a worker's start adds: torch, then torch._dynamo's import, which
    the first optimizer triggers). The worker's own tests, end to end and across processes, keep it."""
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")


@pytest.fixture
def tiny_family() -> str:
    """A healthy, very small family registered from an importable test module."""
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    return "tiny"


@pytest.fixture(autouse=True)
def reasons(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every reason worded in this process during the test (all pass through ``_wording._fitting``: measured,
    forced, heuristic, similar-machine, imported, shipped, noisy, older rules); the test fails when one is not
    one sentence of at most 160 characters."""
    worded: list[str] = []
    fitting = _wording._fitting

    def recorded(answer: str, forms: Sequence[str], *, short: str | None = None) -> str:
        sentence = fitting(answer, forms, short=short)
        worded.append(sentence)
        return sentence

    monkeypatch.setattr(_wording, "_fitting", recorded)
    yield worded
    wrong = {reason: problem for reason in worded if (problem := one_sentence_problem(reason)) is not None}
    assert not wrong, f"reasons that are not one sentence of at most {_wording.REASON_CHARS} characters: {wrong}"


@pytest.fixture
def container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``container(cpus=96, **{"cpu.max": "200000 100000"})``: this process as a ``docker run --cpus=2`` on a
    96-core host sees itself, a cgroup v2 namespace of its own mounted at /sys/fs/cgroup. Only the OS boundary is
    replaced: the affinity (every one of the host's ``cpus``) and the files ``autotune._quota`` reads, as text under
    tmp_path. Returns the cgroup's directory."""
    from autotune import _quota

    root = tmp_path / "root"
    group = root / "sys/fs/cgroup"

    def build(cpus: int = 96, **files: str) -> Path:
        group.mkdir(parents=True, exist_ok=True)
        (root / "proc/self").mkdir(parents=True, exist_ok=True)
        (root / "proc/self/cgroup").write_text("0::/\n")
        (root / "proc/self/mountinfo").write_text(
            "27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n")
        for name, text in files.items():
            (group / name).write_text(text)
        monkeypatch.setattr(_quota, "ROOT", str(root))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
        return group

    return build
