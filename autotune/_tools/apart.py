"""What keeps a DataLoader's measurement from changing the process that asked for it: the dataset read where no
forked worker inherits what it opened, the samplers copied and continued, the random streams and thread count put
back.

A dataset that opens a file lazily (an HDF5 or LMDB handle at its first ``__getitem__``) must not open it in the
process that forks the workers: each would inherit it, which both libraries warn against. So what the measurement
reads itself, rather than through workers, it reads in a process forked for the purpose where workers fork, with
one thread as a worker has (OpenMP's threads do not survive a fork), and otherwise (spawn, forkserver: nothing is
inherited) here on a shallow copy of the dataset, so that a handle it stores on itself is not pickled to the workers
with it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import multiprocessing
import pickle
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler

log = logging.getLogger("autotune")

T = TypeVar("T")

#: a call to ``tick`` each time the work makes progress: the forked process is given up when it makes none this long
Tick = Callable[[], None]


class Silent(Exception):
    """The forked process made no progress for the time allowed: the work would hang here too."""


def apart(work: Callable[[Any, Tick], T], dataset: Any, *, method: str, silent_s: float) -> T:
    """``work(dataset, tick)`` where what it opens stays out of the workers the DataLoader will start by ``method``:
    in a forked process where they fork, else here on a shallow copy of the dataset. Where the forked process fails
    (it raised, or died: a dataset that uses CUDA, or that raises, which here raises with its own exception), the
    work runs here. Raises :class:`Silent` where the forked process made no progress for ``silent_s``."""
    if method == "fork":
        done = _forked(work, dataset, silent_s)
        if done is not None:
            return done[0]
    return work(_shallow(dataset), lambda: None)


def _forked(work: Callable[[Any, Tick], T], dataset: Any, silent_s: float) -> tuple[T] | None:
    method: str = "fork"  # as a str, the context typeshed names on every platform (no ForkContext on Windows)
    context = multiprocessing.get_context(method)
    receiving, sending = context.Pipe(duplex=False)
    # every context has Process; typeshed's BaseContext does not say so. Forked: nothing is pickled
    process = context.Process(target=_run, args=(work, dataset, sending), daemon=True)  # type: ignore[attr-defined]
    try:
        process.start()
    except (AssertionError, OSError) as exc:  # a daemonic process may start none (nor may its DataLoader)
        log.debug("no process forked to measure loading (%s): measuring here", exc)
        receiving.close()
        return None
    finally:
        sending.close()
    try:
        while True:
            if not receiving.poll(silent_s):
                raise Silent(f"no progress in {silent_s:g} s")
            message = receiving.recv()
            if message != "tick":
                break
    except EOFError:
        log.debug("the forked process measuring loading died (exit code %s): measuring here", process.exitcode)
        return None
    finally:
        receiving.close()
        process.kill()
        process.join()
    if isinstance(message, str):
        log.debug("the forked process measuring loading raised %s: measuring here", message)
        return None
    return message  # type: ignore[no-any-return]


def _run(work: Callable[[Any, Tick], Any], dataset: Any, sending: Connection) -> None:
    torch.set_num_threads(1)  # as a DataLoader worker does: the parent's OpenMP threads are not in a forked process
    try:
        done = (work(dataset, lambda: sending.send("tick")),)
        payload = pickle.dumps(done)
    except Exception as exc:  # the dataset's own code (or a result that does not pickle): the work runs here
        sending.send(f"{type(exc).__name__}: {exc}"[:300])
    else:
        sending.send_bytes(payload)  # what recv() unpickles


def _shallow(dataset: Any) -> Any:
    """A shallow copy of ``dataset``, where it can be copied; else the dataset itself."""
    try:
        return copy.copy(dataset)
    except Exception as exc:  # an object that refuses copying: read as it is
        log.debug("%s cannot be copied (%s): read as it is", type(dataset).__name__, exc)
        return dataset


class Continuing(Sampler[Any]):
    """An order of indices (or of batches) that each iteration takes up where the last left off, endlessly, in
    iterations of ``length``: each timed setting reads samples no earlier one read, so the page cache flatters none.
    ``taken``: how many it handed out."""

    def __init__(self, order: Iterable[Any], length: int) -> None:
        self.order = order
        self.length = length
        self.taken = 0
        self._endless = self._cycle()

    def _cycle(self) -> Iterator[Any]:
        while True:
            empty = True
            for item in self.order:
                empty = False
                self.taken += 1
                yield item
            if empty:
                return

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self._endless, self.length)

    def __len__(self) -> int:
        return self.length

    def skip_to(self, taken: int) -> None:
        """Hand out nothing of what a copy of this order already handed out, up to ``taken`` items."""
        for _ in itertools.islice(self._endless, max(0, taken - self.taken)):
            pass


def sampling(dataset: Any, fixed: Mapping[str, Any], *, batch_size: int, length: int) -> dict[str, Any]:
    """The DataLoader keywords that sample as ``fixed`` does, from copies: the user's ``sampler=`` or
    ``batch_sampler=`` copied (the dataset they hold shared, not copied), ``shuffle=True`` by a generator of its own,
    ``generator=`` cloned; each order :class:`Continuing`. The user's objects and their random streams are not
    advanced."""
    generator = torch.Generator()
    if (given := fixed.get("generator")) is not None:
        generator.set_state(given.get_state())
    if fixed.get("batch_sampler") is not None:
        batches = _copied(fixed["batch_sampler"], dataset, fallback=lambda: BatchSampler(range(length), batch_size,
                                                                                          drop_last=False))
        return {"batch_sampler": Continuing(batches, _length(batches, length // batch_size)), "generator": generator}
    if fixed.get("sampler") is not None:
        order: Iterable[Any] = _copied(fixed["sampler"], dataset, fallback=lambda: range(length))
    elif fixed.get("shuffle"):
        order = RandomSampler(range(length), generator=generator)
    else:
        order = range(length)
    return {"sampler": Continuing(order, _length(order, length)), "generator": generator}


def _copied(sampler: Any, dataset: Any, *, fallback: Callable[[], Iterable[Any]]) -> Iterable[Any]:
    try:
        return copy.deepcopy(sampler, {id(dataset): dataset})
    except Exception as exc:  # a sampler that refuses copying is not iterated: its state is the user's
        log.debug("%s cannot be copied (%s): measured in order instead", type(sampler).__name__, exc)
        return fallback()


def _length(order: Any, default: int) -> int:
    try:
        return max(1, len(order))
    except TypeError:  # a sampler without __len__
        return default


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """The caller's random streams and thread count as they were, whatever the measurement (or a dataset read
    without workers) drew: torch's CPU generator and every initialised CUDA device's, Python's ``random`` and
    NumPy's global generator (where NumPy is loaded: else there is no stream to keep)."""
    threads = torch.get_num_threads()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
        torch.set_num_threads(threads)


__all__ = ["Continuing", "Silent", "apart", "sampling", "untouched"]
