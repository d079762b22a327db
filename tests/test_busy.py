"""A result is flagged as measured on a busy machine only when something else took the machine: the worker's own
thread pools do not count.

Linux only: thread states are read from /proc."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from autotune import _fp32
from autotune._families import get_family
from autotune._lab import load
from autotune._lab.load import _proc
from autotune._lab.step import TrainStep
from autotune._records import Candidate
from autotune.backends import backend_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


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
