"""Tests that start processes: workers, the CLI, a frozen app, the examples."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest


@pytest.fixture
def spawned() -> Iterator[None]:
    """Worker processes started by spawn, as on macOS and Windows (or under CUDA): the dataset is pickled."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)
