"""Every script in examples/ runs as written, on tiny budgets: the plain loop, the app's background start, Lightning,
Accelerate, shipping results in this process (calibration too: the worker is not their subject), and torchrun's two
processes on gloo over loopback as a job of its own."""

from __future__ import annotations

import os
import re
import runpy
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import autotune
from autotune._tools import loader as loader_tuner

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
#: how long the torchrun job may take at most (a busy 2-core machine starts 3 interpreters that import torch)
JOB_TIMEOUT_S = 420


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, in_process: None) -> Callable[[str], object]:
    """``example("train.py")``: the script's ``main()``, run here with examples/ importable, as
    ``python examples/train.py`` runs it; the DataLoader's measurement on the budget its own tests give it."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setattr(loader_tuner, "BUDGET_S", 1.0)

    def run(name: str) -> object:
        return runpy.run_path(str(EXAMPLES / name), run_name="example")["main"]()

    return run


def test_the_plain_loop_trains_under_the_guard(example: Callable[[str], object],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    summary = example("train.py")
    assert isinstance(summary, autotune.LoopSummary) and summary.model_kind == "classifier"
    assert summary.steps == summary.batches == 3
    reason = capsys.readouterr().out.splitlines()[0]
    assert reason == autotune.best_config("classifier").reason


def test_the_app_trains_at_once_and_switches_to_the_measurement(example: Callable[[str], object],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = example("in_app.py")
    assert isinstance(cfg, autotune.Config) and cfg.source == "measured"
    assert capsys.readouterr().out.startswith("heuristic - ")


def test_lightning_fits_with_the_measured_config_and_the_guard(example: Callable[[str], object]) -> None:
    trainer = example("with_lightning.py")
    guard = next(callback for callback in trainer.callbacks if isinstance(callback, autotune.GuardCallback))
    assert trainer.global_step == 3 and guard.guard.steps == 3


def test_accelerate_trains_with_the_measured_config_and_the_guard(example: Callable[[str], object]) -> None:
    summary = example("with_accelerate.py")
    assert isinstance(summary, autotune.LoopSummary) and summary.steps == 3


def test_shipped_results_answer_the_first_launch_without_measuring(example: Callable[[str], object]) -> None:
    cfg = example("ship_results.py")
    assert isinstance(cfg, autotune.Config) and cfg.source == "measured" and "shipped in results.json" in cfg.reason


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_torchrun_two_processes_on_gloo_train_one_answer(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AUTOTUNE_")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), AUTOTUNE_CACHE_DIR=str(tmp_path),
               AUTOTUNE_BUDGET_S="0.3", AUTOTUNE_SEARCH="precision", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(_free_port()), str(EXAMPLES / "with_torchrun.py")],
                          env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = sorted(re.findall(r"^rank (\d): (\S+ \S+): .*steps=(\d+)", done.stdout, re.MULTILINE))
    assert [rank for rank, _, _ in lines] == ["0", "1"]
    # one answer; 192 samples, 32 a batch, 2 ranks: 3 steps each
    assert lines[0][1] == lines[1][1] and lines[0][2] == lines[1][2] == "3"

