"""The other processes of a job, as load: copies of the timed step running alongside it.

A job of N processes per machine (torchrun's ``--nproc-per-node``) runs N training steps at once, and a CPU
step's time then depends on what the others take from the cores, the caches and the memory bandwidth: a thread
count that is fastest alone is not fastest beside N - 1 others. So the worker times each CPU candidate while N - 1
copies (``python -m autotune._lab.entry WORKER_PID copies``) run the same candidate's step back to back: told which
candidate to run before each block of timed steps, and to pause after it, so that the control workload and the
set-ups run alone. A copy builds a candidate once, as the worker does (same family, seed and settings), and dies
with the worker.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import IO

import torch
from pydantic import BaseModel, ConfigDict

from autotune._apply import fp32 as _fp32
from autotune._families import Family
from autotune._lab import entry
from autotune._lab.measure import Steppable
from autotune._lab.step import TrainStep
from autotune._records import Candidate
from autotune.backends import backend_for


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LoadSetup(_Message):
    """What every copy builds its steps from: the worker's family, seed and settings."""

    family: Family
    seed: int
    fp32: _fp32.Fp32Settings
    #: each process's share of the cores: a candidate without a count of its own runs with it
    threads: int
    sys_path: list[str]


class LoadOrder(_Message):
    """Run ``run``'s step back to back from now on (None: pause), after freeing the steps of ``release``."""

    run: Candidate | None
    release: list[Candidate] = []


class LoadState(_Message):
    """A copy's answer to an order, once it holds: running its first step done (or paused), or why it cannot."""

    running: Candidate | None
    failure: str | None = None


class LoadFailed(RuntimeError):
    """A copy of the step could not run alongside the timed one: the timing would not be the job's."""


class Load:
    """``copies`` processes that run a candidate's step alongside the worker's: ``with load.running(candidate):``
    around each block of its timed steps."""

    def __init__(self, copies: int, setup: LoadSetup) -> None:
        argv = entry.command(os.getpid(), "copies")
        self._copies: list[subprocess.Popen[str]] = []
        try:
            for _ in range(copies):
                self._copies.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                     text=True, encoding="utf-8"))
            for copy in self._copies:
                assert copy.stdout is not None
                said = copy.stdout.readline().strip()
                if said != entry.HELLO:
                    raise LoadFailed(f"a copy of the step ({shlex.join(argv)}) said {said[:200]!r} where "
                                     f"{entry.HELLO!r} was expected (status {copy.poll()})")
            self._send(setup.model_dump_json())
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The copies' process ids: their CPU time is the job's, not another process's."""
        return [copy.pid for copy in self._copies]

    def __enter__(self) -> Load:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @contextlib.contextmanager
    def running(self, candidate: Candidate) -> Iterator[None]:
        """Every copy runs ``candidate``'s step (its first one done) within the block, and is paused after it."""
        self._order(LoadOrder(run=candidate))
        try:
            yield
        finally:
            self._order(LoadOrder(run=None))

    def release(self, candidates: list[Candidate]) -> None:
        """The copies free their steps of ``candidates`` (no longer timed)."""
        if candidates:
            self._order(LoadOrder(run=None, release=candidates))

    def close(self) -> None:
        for copy in self._copies:
            with contextlib.suppress(OSError):
                if copy.stdin is not None:
                    copy.stdin.close()  # end of orders: the copy exits
        for copy in self._copies:
            try:
                copy.wait(timeout=5)
            except subprocess.TimeoutExpired:
                copy.kill()
                copy.wait()
            if copy.stdout is not None:
                copy.stdout.close()
        self._copies = []

    def _order(self, order: LoadOrder) -> None:
        """Send ``order`` to every copy and wait until each holds it (a copy that hangs hangs the worker, whose
        host kills it after its candidate timeout)."""
        self._send(order.model_dump_json())
        for copy in self._copies:
            assert copy.stdout is not None
            line = copy.stdout.readline()
            if not line:
                raise LoadFailed(f"a copy of the step running alongside (pid {copy.pid}) stopped with status "
                                 f"{copy.wait()} when told to run {order.run.label if order.run else 'nothing'}")
            state = LoadState.model_validate_json(line)
            if state.failure is not None:
                raise LoadFailed(f"a copy of the step running alongside cannot run "
                                 f"{order.run.label if order.run else 'nothing'}: {state.failure}")

    def _send(self, line: str) -> None:
        for copy in self._copies:
            assert copy.stdin is not None
            try:
                copy.stdin.write(line + "\n")
                copy.stdin.flush()
            except OSError as exc:
                raise LoadFailed(f"a copy of the step running alongside (pid {copy.pid}) is gone: {exc}") from None


class Loaded:
    """A CPU candidate's step that runs while the load runs the same candidate's: what one of the job's processes
    sees. Steps and synchronisation are the candidate's own."""

    asynchronous = False

    def __init__(self, step: Steppable, candidate: Candidate, load: Load) -> None:
        self.step = step
        self.candidate = candidate
        self.load = load

    def run(self, steps: int = 1) -> None:
        self.step.run(steps)

    def span(self, steps: int) -> list[float]:
        return self.step.span(steps)

    @contextlib.contextmanager
    def selected(self) -> Iterator[None]:
        with self.load.running(self.candidate), self.step.selected():
            yield


_END = object()


def _read_orders(stream: IO[str], orders: queue.Queue[object]) -> None:
    for line in stream:
        orders.put(LoadOrder.model_validate_json(line))
    orders.put(_END)


def main(protocol: IO[str]) -> int:
    """A copy: read the set-up, then run what each order says until the worker closes the orders; answers go to
    ``protocol`` (``entry`` keeps the original stdout for it)."""
    setup = LoadSetup.model_validate_json(sys.stdin.readline())
    sys.path[:0] = [p for p in setup.sys_path if p not in sys.path]
    torch.set_num_threads(setup.threads)
    _fp32.ensure(setup.fp32)
    orders: queue.Queue[object] = queue.Queue()
    threading.Thread(target=_read_orders, args=(sys.stdin, orders), daemon=True).start()
    steps: dict[Candidate, TrainStep] = {}
    running: TrainStep | None = None
    selected = contextlib.ExitStack()
    while True:
        try:
            order = orders.get(block=running is None)
        except queue.Empty:
            assert running is not None
            running.run()
            continue
        selected.close()
        running = None
        if order is _END:
            return 0
        assert isinstance(order, LoadOrder)
        for candidate in order.release:
            steps.pop(candidate, None)
        failure = None
        if order.run is not None:
            try:
                step = steps.get(order.run)
                if step is None:
                    step = steps[order.run] = TrainStep(setup.family, order.run, backend_for(order.run.device),
                                                        seed=setup.seed, fp32_host=setup.fp32)
                selected.enter_context(step.selected())
                step.run()
                running = step
            except Exception as exc:
                selected.close()
                failure = f"{type(exc).__name__}: {exc}"
        protocol.write(LoadState(running=running.candidate if running else None, failure=failure).model_dump_json()
                       + "\n")


__all__ = ["Load", "LoadFailed", "LoadOrder", "LoadSetup", "LoadState", "Loaded", "main"]
