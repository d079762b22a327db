"""A worker started early, before the app asks (real processes): the calibration takes it, one that died is
replaced, one nobody takes is killed, and none starts where nothing may be measured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from procs_for_tests import SETTINGS, alive

import autotune
from autotune._families import get_family
from autotune._lab.host.worker import Worker


@pytest.fixture
def early(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, container: Callable[..., Path]) -> Iterator[None]:
    """``launch`` as on a machine of several cores where nothing else measures (a temporary directory of its own,
    where the machine's measuring lock lives), and nothing started early left for the next test."""
    from autotune._lab.host import launch

    container(cpus=2)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield
    launch.discard()


@pytest.mark.usefixtures("early")
def test_the_worker_started_early_is_the_one_the_calibration_uses() -> None:
    from autotune._lab.host import launch

    launch.start_early()  # as ``python -m autotune`` does before the host imports torch
    started = launch._early[0].tree.proc.pid
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        worker.start()
        assert worker.pid == started
        result = worker.run_family(get_family("tiny"), SETTINGS)
        assert worker.starts == 1
    assert any(r.usable for r in result.candidates) and not alive(started)


@pytest.mark.usefixtures("early")
def test_a_worker_started_early_that_died_is_replaced_and_one_nobody_takes_is_killed() -> None:
    from autotune._lab.host import launch

    launch.start_early()
    dead = launch._early[0].tree
    dead.kill()
    dead.proc.wait()
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        worker.start()
        assert worker.pid not in (None, dead.proc.pid)
    launch.start_early()
    unused = launch._early[0].tree.proc.pid
    launch.discard()
    assert not alive(unused) and not launch._early


@pytest.mark.usefixtures("early")
def test_a_worker_started_early_that_dies_before_its_first_job_is_replaced_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from autotune._errors import WorkerStartError
    from autotune._lab.host import launch

    autotune.register_family("tiny", "families_for_tests:build_tiny")
    launch.start_early()
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        worker.start()  # takes the worker started early
        taken = worker.pid
        assert taken is not None
        os.killpg(taken, signal.SIGKILL)  # dies after take(), before its first job
        result = worker.run_family(get_family("tiny"), SETTINGS)
        assert worker.starts == 2 and worker.pid != taken
    assert any(r.usable for r in result.candidates)

    dying = tmp_path / "dying"  # a replacement that dies as its interpreter starts: a second death
    dying.mkdir()
    (dying / "sitecustomize.py").write_text("import os\nos._exit(7)\n")
    launch.start_early()
    with Worker(isolation="subprocess", timeout_s=60) as worker:
        worker.start()
        taken = worker.pid
        assert taken is not None
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(dying), *filter(None, [os.environ.get("PYTHONPATH")])]))
        os.killpg(taken, signal.SIGKILL)
        with pytest.raises(WorkerStartError, match="exit status 7") as raised:
            worker.run_family(get_family("tiny"), SETTINGS)
        assert raised.value.status == 7
        assert worker.starts == 2


@pytest.mark.usefixtures("early")
def test_a_worker_started_early_gets_through_a_chatty_import_before_anyone_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune._lab import entry
    from autotune._lab.host import launch
    from autotune._lab.protocol import EVENT, Ready

    monkeypatch.setenv("PYTHONVERBOSE", "1")  # the worker writes a line to stderr for each module it imports
    launch.start_early()
    early = launch._early[0]
    assert early.lines.get(timeout=120) == entry.HELLO + "\n"
    line = early.lines.get(timeout=120)  # its stderr, far more than a pipe holds, was read meanwhile
    assert line is not None and isinstance(EVENT.validate_json(line), Ready)
    assert any("import" in tail for tail in early.stderr_tail)


@pytest.mark.usefixtures("early")
def test_no_worker_starts_early_in_process_or_while_another_process_measures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune._cache.locks import measuring_lock
    from autotune._lab.host import launch

    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    launch.start_early()
    assert not launch._early
    monkeypatch.delenv("AUTOTUNE_ISOLATION")
    holder = subprocess.Popen(  # another process measuring on this machine holds the measuring lock
        [sys.executable, "-c", "import sys, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
         "print('held', flush=True); sys.stdin.readline()", str(measuring_lock().lock_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    launch.start_early()
    assert not launch._early
    holder.communicate("\n", timeout=30)
    launch.start_early()
    assert launch._early


def test_the_command_line_starts_its_worker_before_torch_and_only_when_it_may_measure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune import __main__ as entry
    from autotune import _cli
    from autotune._lab.host import launch

    code = ("import sys, autotune.__main__, autotune._args, autotune._lab.host.launch; "
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('autotune')]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls: list[str] = []
    monkeypatch.setattr(launch, "start_early", lambda: calls.append("start"))
    monkeypatch.setattr(launch, "discard", lambda: calls.append("discard"))
    monkeypatch.setattr(_cli, "main", lambda: calls.append("main") or 0)
    for argv, expected in [([], ["start", "main", "discard"]), (["--recalibrate"], ["start", "main", "discard"]),
                           (["--export", "x.json"], ["main", "discard"]), (["--clear"], ["main", "discard"])]:
        calls.clear()
        monkeypatch.setattr(sys, "argv", ["autotune", *argv])
        assert entry.run() == 0 and calls == expected, argv
    monkeypatch.setattr(sys, "argv", ["autotune", "--steps", "x"])
    calls.clear()
    with pytest.raises(SystemExit):
        entry.run()
    assert calls == []  # a usage error starts nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_command_that_measures_nothing_leaves_no_worker_behind(isolated_autotune: Path) -> None:
    """``python -m autotune`` starts a worker before it knows whether anything needs measuring; a usage error
    (or a cache that answers everything) must not leave it running."""
    mark = f"MARK_{os.getpid()}_{time.monotonic_ns()}"  # inherited by the worker: tells it from any other
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "--family", "cnm"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TEST_EARLY_WORKER": mark})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "cnm" in err

    def ours(pid: str) -> bool:
        try:
            return mark.encode() in Path(f"/proc/{pid}/environ").read_bytes() and alive(int(pid))
        except OSError:  # gone meanwhile, or another user's
            return False

    assert [pid for pid in filter(str.isdigit, os.listdir("/proc")) if ours(pid)] == []
