"""The real search and decision code on a fake clock (``autotune.testing``): no process, no wall time. With
tests/unit, the tiers CI runs first: a failure here stops the run before the slow tiers start."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _starts_no_process(no_process: list[str]) -> None:
    """Every test here fails on any process it starts (tests/conftest.py's ``no_process``)."""
