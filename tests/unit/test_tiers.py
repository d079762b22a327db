"""The tests in tiers by cost: the first two start no process (their conftest's fixture refuses every start), and
no test file outgrows a sitting."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
#: in the order CI runs them: pure, fake clock, calibrations in this process, processes, many processes, a GPU
TIERS = ("unit", "sim", "calibrate", "process", "ranks", "gpu")
#: at most, for a test file (``test_*.py``, ``conftest.py``) read in one sitting
FILE_LINES = 400


def test_every_test_is_in_a_tier_and_the_first_two_refuse_processes() -> None:
    assert sorted(path.name for path in TESTS.iterdir() if path.is_dir() and not path.name.startswith((".", "_"))) \
        == sorted(TIERS)
    assert [path.name for path in TESTS.glob("test_*.py")] == []
    for tier in TIERS[:2]:
        assert "no_process" in (TESTS / tier / "conftest.py").read_text()


def test_no_test_file_outgrows_a_sitting() -> None:
    files = [*TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py")]
    long = {str(path.relative_to(TESTS)): lines for path in files
            if (lines := len(path.read_text().splitlines())) > FILE_LINES}
    assert long == {}


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    lambda: os.popen("true"),
    lambda: os.fork(),
    lambda: os.system("true"),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
], ids=["subprocess", "popen", "fork", "system", "spawn", "fork-context"])
def test_a_process_started_in_this_tier_fails_the_test(start: object, no_process: list[str]) -> None:
    with pytest.raises(BaseException, match="a test in this tier starts no process") as raised:
        start()  # type: ignore[operator]
    assert not isinstance(raised.value, Exception)  # so no ``except Exception`` in the code under test hides it
    assert no_process  # what the fixture's teardown fails on
    no_process.clear()  # this test's own starts were meant
