"""The DataLoader workers a measurement tries: how many (up to the cores and the memory this process may use), the
training's threads beside them, how they start (as the user's DataLoader starts them), and whether workers started
so can receive the dataset."""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from autotune._variants import CPU
from autotune.backends import _linux, backend_for

#: a worker silent this long is ruled out (DataLoader's ``timeout``)
TIMEOUT_S = 30.0
#: the workers together are measured within this share of the memory available: the training, its batches and the
#: page cache need the rest
MEMORY_SHARE = 0.5


def most_workers(cores: int, processes: int) -> int:
    """The most workers measured, e.g. 2 in a ``--cpus=2`` container on a 96-core host: one per core this process
    may use (``cores``: its affinity, its CPU quota, its share in a job of ``processes``), no more than fit in
    ``MEMORY_SHARE`` of the memory available to its share, each counted at this process's own resident memory (a
    forked worker comes to hold what it writes of it, Python's reference counts included; a spawned one imports
    torch and the dataset again); at least one. Where the memory is not known (not Linux), the cores alone."""
    available = backend_for(CPU).free_memory_bytes(CPU)
    worker_bytes = _linux.anonymous_bytes()
    if available is None or not worker_bytes:
        return max(1, cores)
    return max(1, min(cores, int(available * MEMORY_SHARE / processes) // worker_bytes))


def worker_counts(most: int, batches: int, fixed: int | None, *, zero: bool) -> list[int]:
    """The worker counts in the order they are measured: none, the most (``most``, fewer where there are fewer
    batches), then the ones between, fewest first."""
    if fixed is not None:
        return [fixed]
    most = max(1, min(most, batches))
    between = sorted({2**i for i in range(most.bit_length()) if 2**i < most})
    return [*([0] if zero else []), most, *between]


def thread_counts(threads: int | None, workers: int, cores: int) -> list[int | None]:
    """The training's CPU threads to measure with ``workers``: fewer where the workers would leave the training
    fewer of its ``cores`` (first: oversubscribed cores stall every parallel region), then the config's; the
    accelerators' are left as they are."""
    if threads is None or not workers:
        return [threads]
    fewer = max(1, min(threads, cores - workers))
    return [threads] if fewer == threads else [fewer, threads]


def start_method(fixed: Mapping[str, Any]) -> str:
    """How the user's DataLoader will start its workers, e.g. ``'fork'``: by the ``multiprocessing_context`` fixed,
    else by this program's default. The measurement passes none of its own: forked workers in a process that
    trains on CUDA are PyTorch's normal case (they do CPU work), and spawn would lose the datasets and transforms
    defined in ``__main__`` that the user's loop loads."""
    given = fixed.get("multiprocessing_context")
    if given is not None:
        return given if isinstance(given, str) else str(given.get_start_method())
    # the first of get_all_start_methods() is the platform's default; get_start_method() would fix it for good
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def unreceived(dataset: Any, method: str) -> str | None:
    """Why worker processes started by ``method`` cannot be started with ``dataset``, found by starting one process
    the same way that unpickles it (spawned and forkserver workers import what its pickle names: a class defined in
    ``__main__`` of ``python -c`` or a notebook is not there); None where that process receives it, or says nothing
    within ``TIMEOUT_S``."""
    context = multiprocessing.get_context(method)
    receiving, sending = context.Pipe(duplex=False)
    # every context has Process; typeshed's BaseContext, for a method named at run time, does not say so
    process = context.Process(  # type: ignore[attr-defined]
        target=_receive, args=(bytes(ForkingPickler.dumps(dataset)), sending), daemon=True)
    process.start()
    sending.close()
    try:
        if not receiving.poll(TIMEOUT_S):
            return None  # still starting: the workers' death is not the dataset's to explain
        unpickled: str | None = receiving.recv()
    except EOFError:  # it exited before the dataset (in a script without a __main__ guard, Python says why on stderr)
        return None
    finally:
        receiving.close()
        process.kill()
        process.join()
    return None if unpickled is None else cannot_receive(method, unpickled)


def _receive(payload: bytes, sending: Connection) -> None:
    """In a process started as a worker is: unpickle the dataset, and send back what that raised (None: nothing)."""
    try:
        pickle.loads(payload)
    except Exception as exc:  # whatever unpickling the user's dataset raises is the workers' cause
        sending.send(f"{type(exc).__name__}: {exc}"[:300])
    else:
        sending.send(None)


def cannot_receive(method: str, why: str) -> str:
    return (f"worker processes started by {method} cannot receive the dataset ({why[:300]}): define its class and "
            "what it holds in a module they can import, no lambdas or nested functions")


__all__ = ["MEMORY_SHARE", "TIMEOUT_S", "cannot_receive", "most_workers", "start_method", "thread_counts",
           "unreceived", "worker_counts"]
