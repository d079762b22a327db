from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import autotune
from autotune import _api, _fp32


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
    _api.reset_state()
    threads = torch.get_num_threads()
    with _fp32.preserved():  # an in-process candidate, a framework or a test may switch them: put them back
        yield cache
    _api.reset_state()
    torch.set_num_threads(threads)


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
