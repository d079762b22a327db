"""The fingerprint across processes: the same in a fresh interpreter, another budget under OMP_NUM_THREADS=1, and a
measured answer that holds after the app changes its thread count. Within a process: tests/unit/test_fingerprint.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import autotune

#: prints the digest of a new process, after ``before`` ran
FRESH = "import torch; {before}; import autotune; print(autotune.fingerprint().digest)"


def _digest_of_a_new_process(before: str = "pass", **environment: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", FRESH.format(before=before)], capture_output=True, text=True,
                          check=True, env={**env, **environment}).stdout.strip()


def test_fingerprint_is_stable_across_processes() -> None:
    code = "import autotune; print(autotune.fingerprint().digest)"
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert digests == {autotune.fingerprint().digest}


def test_omp_num_threads_1_is_another_budget_and_set_num_threads_1_is_not() -> None:
    unset = autotune.fingerprint().digest
    assert _digest_of_a_new_process(OMP_NUM_THREADS="1") != unset
    assert _digest_of_a_new_process("torch.set_num_threads(1)") == unset


@pytest.mark.usefixtures("in_process")
def test_a_measured_answer_holds_after_the_app_changes_its_thread_count(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    measured = autotune.best_config(tiny_family)
    assert measured.source == "measured"
    torch.set_num_threads(torch.get_num_threads() + 1)  # the conftest puts the count back
    for answer in (autotune.best_config(tiny_family, wait=False), autotune.best_config(tiny_family)):
        assert answer == measured and answer.fingerprint_digest == autotune.fingerprint().digest
