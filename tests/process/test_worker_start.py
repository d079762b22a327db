"""A worker that cannot start is said as such, within seconds, and nothing is measured, stored or left running.

Each fault is a real process: an interpreter named by ``AUTOTUNE_WORKER_PYTHON`` that is not there, a worker whose
interpreter exits at once, prints something else, says another version's hello or says nothing (a
``sitecustomize`` on its PYTHONPATH), and a frozen app (a script that says it is frozen and is its own
``sys.executable``) with and without ``autotune.freeze_support()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import autotune
from autotune._lab.host import process

TESTS = Path(__file__).parents[1]

FAULTS = '''
import os, sys, time

fault = os.environ.get("WORKER_START_FAULT")
if fault and "autotune._lab.entry" in " ".join(sys.orig_argv):
    with open(os.environ["WORKER_START_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    if fault == "exit":
        sys.stderr.write("this interpreter has no torch\\n")
        sys.stderr.flush()
        os._exit(3)
    if fault == "garbage":
        print("Welcome to MyApp 1.0", flush=True)
    elif fault == "other-version":
        print("autotune-worker 0.0.1", flush=True)
    time.sleep(600)
'''


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workers started from now on run FAULTS first; returns the file each writes its pid to."""
    hook = tmp_path / "faults"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAULTS)
    pids = tmp_path / "worker-pids"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("WORKER_START_PIDS", str(pids))
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    return pids


def _started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()]


def _nothing_stored(cache: Path) -> bool:
    return not any(cache.glob("*.json")) or all("tiny" not in path.read_text() for path in cache.glob("*.json"))


@pytest.mark.parametrize(("fault", "said", "status"), [
    ("exit", "stopped before it was ready", 3),
    ("garbage", "wrote 'Welcome to MyApp 1.0' where autotune's worker says", None),
    ("other-version", f"runs autotune 0.0.1, this process {autotune.__version__}", None),
], ids=["exits-at-once", "prints-garbage", "another-autotune"])
def test_a_worker_that_does_not_start_is_said_as_such(
    faulty: Path, isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, fault: str, said: str, status: int | None,
) -> None:
    monkeypatch.setenv("WORKER_START_FAULT", fault)
    with pytest.raises(autotune.WorkerStartError) as raised:
        autotune.best_config("tiny")
    error = raised.value
    assert said in error.why and error.status == status
    assert error.argv[1:3] == ["-m", "autotune._lab.entry"]
    assert "no candidate could train" not in str(error) and "AUTOTUNE_WORKER_PYTHON" in str(error)
    if fault == "exit":
        assert error.stderr == ["this interpreter has no torch"]
    assert _started(faulty) and not any(psutil.pid_exists(pid) for pid in _started(faulty))  # none left running
    assert _nothing_stored(isolated_autotune)

    monkeypatch.delenv("WORKER_START_FAULT")  # nothing was recorded against the family: it measures next time
    assert autotune.best_config("tiny").source == "measured"


def test_a_worker_that_says_nothing_is_stopped_after_the_hello_timeout(
    faulty: Path, isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORKER_START_FAULT", "silent")
    monkeypatch.setattr(process, "HELLO_TIMEOUT_S", 2.0)  # 30 s covers a frozen app's start on a slow disk
    with pytest.raises(autotune.WorkerStartError, match="said nothing for 2 s") as raised:
        autotune.calibrate(["tiny"])
    assert raised.value.status is None
    assert not any(psutil.pid_exists(pid) for pid in _started(faulty))
    assert _nothing_stored(isolated_autotune)


def test_a_named_interpreter_that_is_not_there_is_refused_before_anything_starts(
    isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    missing = tmp_path / "no" / "python"
    monkeypatch.setenv("AUTOTUNE_WORKER_PYTHON", str(missing))
    with pytest.raises(autotune.ConfigurationError, match="AUTOTUNE_WORKER_PYTHON=.*there is no file at"):
        autotune.best_config("tiny_mlp")
    monkeypatch.delenv("AUTOTUNE_WORKER_PYTHON")
    with pytest.raises(autotune.ConfigurationError, match="there is no file at"):
        autotune.set_worker_python(missing)
    assert "AUTOTUNE_WORKER_PYTHON" not in os.environ  # a refused path is not kept
    assert _nothing_stored(isolated_autotune)


def test_the_worker_runs_on_the_interpreter_the_app_names(
    isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("AUTOTUNE_WORKER_PYTHON", "")  # restored after the test: set_worker_python sets it
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    autotune.set_worker_python(sys.executable)
    assert os.environ["AUTOTUNE_WORKER_PYTHON"] == sys.executable
    from autotune._lab.host.launch import worker_argv

    assert worker_argv()[:3] == [sys.executable, "-m", "autotune._lab.entry"]
    assert autotune.best_config("tiny").source == "measured"
    autotune.set_worker_python(None)
    assert "AUTOTUNE_WORKER_PYTHON" not in os.environ


FROZEN_APP = '''#!{python}
"""A frozen app, as far as autotune can tell: sys.frozen, and sys.executable is the app itself."""
import json, os, sys
sys.frozen = True
sys.executable = os.environ.get("APP_EXECUTABLE") or os.path.abspath(__file__)
import autotune
{freeze_support}
with open(os.environ["APP_MAINS"], "a") as f:
    f.write(f"{{os.getpid()}}\\n")
autotune.register_family("tiny", "families_for_tests:build_tiny")
try:
    cfg = autotune.best_config("tiny")
except autotune.WorkerStartError as exc:
    print(json.dumps({{"error": str(exc), "status": exc.status, "argv": exc.argv}}))
else:
    print(json.dumps({{"source": cfg.source}}))
'''


@pytest.mark.skipif(sys.platform == "win32", reason="a script is no executable there; the PyInstaller test is")
@pytest.mark.parametrize(("calls_freeze_support", "bootloader"), [(True, False), (False, False), (True, True)],
                         ids=["freeze_support", "no-call", "one-file-bootloader"])
def test_a_frozen_app_is_its_own_worker_once_it_calls_freeze_support(
    tmp_path: Path, isolated_autotune: Path, calls_freeze_support: bool, bootloader: bool,
) -> None:
    app = tmp_path / "app"
    app.write_text(FROZEN_APP.format(python=sys.executable, freeze_support=(
        "autotune.freeze_support()" if calls_freeze_support else "")))
    app.chmod(0o755)
    mains = tmp_path / "mains"
    env = {**os.environ, "APP_MAINS": str(mains),
           "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if bootloader:  # a one-file app's executable unpacks the app, then runs it as its child: the host is a grandparent
        launcher = tmp_path / "launcher"
        launcher.write_text(f'#!/bin/sh\n"{app}" "$@"\nexit $?\n')  # a command after it: the shell stays
        launcher.chmod(0o755)
        env["APP_EXECUTABLE"] = str(launcher)
    run = subprocess.run([env.get("APP_EXECUTABLE", str(app))], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.splitlines()[-1])
    if calls_freeze_support:
        assert answer == {"source": "measured"}
        assert len(mains.read_text().split()) == 1  # the worker never ran the app's main
        return
    # Without the call the app's copy reaches autotune's API and exits at once, saying what to do.
    assert answer["argv"][:2] == [str(app), "--autotune-worker"] and answer["status"] == 86
    assert "call autotune.freeze_support() first" in answer["error"]
    assert "no candidate could train" not in answer["error"]
    assert len(mains.read_text().split()) == 2  # the host's main, and the copy's until it reached autotune
    assert _nothing_stored(isolated_autotune)


def test_the_package_exports_what_a_frozen_or_embedding_app_calls() -> None:
    code = textwrap.dedent("""
        import sys, autotune
        autotune.freeze_support()  # a process not started as a worker: returns at once, loads nothing heavy
        assert not {"torch", "pydantic"} & set(sys.modules), sorted(sys.modules)
        print("returned")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "returned", run.stderr
    assert {"freeze_support", "set_worker_python", "WorkerStartError"} <= set(autotune.__all__)
