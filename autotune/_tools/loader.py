"""DataLoader settings measured with the training step, for one dataset: ``cfg.dataloader_kwargs(dataset,
batch_size=64)``.

For about ``BUDGET_S`` seconds it runs the loop as the user runs it: the config's own training step (its family's
model at the loader's batch size, on its device, in its precision and variants, uncompiled) fed by a DataLoader over
the user's dataset, one setting after another. Without workers first, then the most workers (the cores this process
may use, its CPU quota included, or in a job of many processes its share of them; no more than fit in
``MEMORY_SHARE`` of the available memory), then the counts between, fewest first; on the CPU each worker count with
the config's training threads and with fewer, leaving the workers their cores: workers and training threads share
the cores, so they are measured together, never added up. A loop within ``KEEP_UP`` of its step keeps up: the
cheapest setting that keeps up wins (costlier ones are not measured), else the fastest. Workers persist across
epochs; memory is pinned where copies from it are asynchronous (CUDA, XPU); workers start as the user's DataLoader
starts them: by the platform's default start method, or the ``multiprocessing_context`` fixed.

A setting whose worker dies or stays silent for ``TIMEOUT_S`` is ruled out and reported, with the cause where one is
found (workers started by spawn or forkserver that cannot receive the dataset: the exception pickling or unpickling
it); an answer without workers because none could run is not kept, so the next call measures again; a dataset that
raises surfaces as a :class:`DatasetError` (its exception the cause) and nothing is cached. Answers are kept per
machine configuration, family, candidate and question (``autotune._cache.loader_answers``): the dataset by its
type, length and first sample's structure without sizes (a random crop's size changes from run to run), the fixed
arguments by what they are (a function or class by its name, a ``partial`` by its function and arguments).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import logging
import math
import multiprocessing
import pickle
import time
import types
import warnings
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from autotune import _fp32
from autotune._cache.loader_answers import Answers
from autotune._errors import ConfigurationError, DatasetError
from autotune._families import get_family
from autotune._fingerprint import default_threads
from autotune._lab.step import TrainStep
from autotune._quota import usable_cores
from autotune._records import Candidate, LoaderReport, LoaderTrial
from autotune._variants import threads_per_process
from autotune._wording import loader_reason
from autotune.backends import Backend, _linux, backend_for, resolve_device

log = logging.getLogger("autotune")

#: the measurement's length in seconds: no setting starts after it, but for no workers and the most workers
BUDGET_S = 5.0
#: each setting's loop is timed over this share of the budget and at least ``MIN_BATCHES`` batches, or over one
#: batch where that takes ``SLOW_SETTINGS`` shares
SETTING_SHARE = 0.1
MIN_BATCHES = 3
SLOW_SETTINGS = 3
#: a loop at most this much slower per step than its step keeps up: without workers, its own steps (nothing else
#: shares the cores, and the comparison is within one timed loop); with workers, the step alone (they may slow it)
KEEP_UP = 0.10
#: a worker silent this long is ruled out (DataLoader's ``timeout``)
TIMEOUT_S = 30.0
#: a deeper prefetch tried for a winner that does not keep up: it absorbs uneven batches, not slow ones
DEEP_PREFETCH = 4
#: the workers together are measured within this share of the memory available: the training, its batches and the
#: page cache need the rest
MEMORY_SHARE = 0.5
#: bumped when what a stored answer means changes (2: workers start as the user's DataLoader starts them; the
#: dataset is keyed without its sample's sizes, the fixed arguments by what they are)
MEASUREMENT_VERSION = 2

#: the DataLoader keywords ``fixed`` may not hold: the dataset and the batch size are arguments of their own
_NOT_FIXED = ("dataset", "batch_size")


def report(candidate: Candidate, model_kind: str, digest: str, dataset: Any, *, batch_size: int, key: str | None,
           fixed: Mapping[str, Any], init_scale: float | None = None, budget_s: float = BUDGET_S,
           force: bool = False, processes: int = 1) -> LoaderReport:
    """The DataLoader settings that measured fastest for ``candidate`` training ``model_kind`` on ``dataset``, from
    the answers of this machine configuration (``digest``) when this question was measured before. ``processes``:
    the job's processes on this machine, each loading with its share of the cores (its workers and its training
    threads beside the others')."""
    _validate(batch_size, key, fixed, budget_s)
    signature, keyed, length = dataset_signature(dataset)
    family = get_family(model_kind)
    question = "|".join([family.name, family.ref, family.version or "", candidate.label,
                         keyed, f"batch {batch_size}", key or "", _described(fixed), f"v{MEASUREMENT_VERSION}"])
    answers = Answers(digest)
    if not force and (known := answers.get(question)) is not None:
        return known
    cores = threads_per_process(usable_cores(), processes)
    measured = _measure(candidate, model_kind, dataset, signature, length, batch_size=batch_size, fixed=fixed,
                        init_scale=init_scale, budget_s=budget_s, cores=cores,
                        most_workers=_most_workers(cores, processes))
    if workers_failed(measured.trials):
        # the user's loop would lose its workers the same way until the cause is fixed: not kept as the best
        log.warning("%s: %s", model_kind, measured.reason)
        return measured
    log.info("%s: %s (measured in %.1f s)", model_kind, measured.reason, measured.wall_s)
    answers.put(question, measured)
    return measured


def workers_failed(trials: Sequence[LoaderTrial]) -> bool:
    """Whether every setting with workers that was tried failed: the answer then has none, and is not kept."""
    with_workers = [t for t in trials if t.num_workers]
    return bool(with_workers) and all(t.failure is not None for t in with_workers)


def keeps_up(trial: LoaderTrial, step_ms: float) -> bool:
    """Whether the loop with ``trial``'s setting is within ``KEEP_UP`` of its step (``step_ms``: the step alone)."""
    if trial.loop_ms is None or trial.data_wait_share is None:
        return False
    step = trial.loop_ms * (1 - trial.data_wait_share) if trial.num_workers == 0 else step_ms
    return trial.loop_ms <= step * (1 + KEEP_UP)


def choose(trials: list[LoaderTrial], step_ms: float) -> LoaderTrial | None:
    """The cheapest setting that keeps up (fewest workers, then the shallower prefetch, then the faster); when none
    does, the fastest; None when every one was ruled out."""
    timed = [t for t in trials if t.loop_ms is not None]
    keeping = [t for t in timed if keeps_up(t, step_ms)]
    if keeping:
        return min(keeping, key=lambda t: (t.num_workers, t.prefetch_factor or 0, t.loop_ms or 0.0))
    return min(timed, key=lambda t: t.loop_ms or 0.0, default=None)


def dataset_signature(dataset: Any) -> tuple[str, str, int]:
    """What describes a dataset, e.g. ``"my_app.data.Photos of 50,000 samples, each (Tensor[float32, 3x64x64],
    int)"``; what identifies it across runs, its tensors by dtype and rank (``"... each (Tensor[float32, 3-d],
    int)"``: a first sample's size may be random, as a random crop's is); and its length. Raises
    :class:`DatasetError` for one that is empty, has no length, is iterable-style, or raises on its first
    sample."""
    name = _named(dataset)
    if isinstance(dataset, IterableDataset):
        raise DatasetError(name, "it is an IterableDataset: each worker would iterate all of it unless it splits "
                           "itself by torch.utils.data.get_worker_info(), so its loading is not measured")
    try:
        length = len(dataset)
    except TypeError as exc:
        raise DatasetError(name, f"it has no len() ({exc}); a map-style dataset needs __len__ and __getitem__") \
            from exc
    if length == 0:
        raise DatasetError(name, "it is empty (len 0)")
    try:
        first = dataset[0]
    except Exception as exc:  # the dataset's own code: its exception, whatever it is, is the answer's cause
        raise DatasetError(name, f"dataset[0] raised {type(exc).__name__}: {exc}") from exc
    shown, keyed = (f"{name} of {length:,} samples, each {_structure(first, sized=sized)}"[:400]
                    for sized in (True, False))
    return shown, keyed, length


# -- measuring ------------------------------------------------------------------------------------------------


class _Unreceivable(Exception):
    """Worker processes cannot be started with the dataset: the message says why and what to do."""


def _measure(candidate: Candidate, model_kind: str, dataset: Any, signature: str, length: int, *, batch_size: int,
             fixed: Mapping[str, Any], init_scale: float | None, budget_s: float, cores: int,
             most_workers: int) -> LoaderReport:
    started = time.perf_counter()
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        resolve_device(candidate.device)
    except LookupError as exc:
        raise ConfigurationError("device", candidate.device, "a device this process can use", why=(
            f"{exc}; the DataLoader is measured with this Config's training step on its device: ask on the machine "
            "that trains")) from exc
    backend = backend_for(candidate.device)
    on_cpu = backend.device_type == "cpu"
    threads = (candidate.num_threads or default_threads()) if on_cpu else None  # as calibration measured it
    method = _start_method(fixed)
    pin = bool(fixed.get("pin_memory", backend.async_copies))
    drop_last = bool(fixed.get("drop_last", False))
    batches = length // batch_size if drop_last else math.ceil(length / batch_size)
    if batches == 0:
        raise DatasetError(_named(dataset), f"drop_last=True leaves no batch of {batch_size} from {length} samples")
    needs_workers = fixed.get("num_workers", 0) > 0 or any(
        fixed.get(name) not in (None, False) for name in ("multiprocessing_context", "persistent_workers",
                                                          "prefetch_factor"))
    counts = _worker_counts(most_workers, batches, fixed.get("num_workers"), zero=not needs_workers)
    setting_s = budget_s * SETTING_SHARE
    family = get_family(model_kind)
    uncompiled = candidate.model_copy(update={"compiled": False})  # compiling takes longer than the budget
    trials: list[LoaderTrial] = []
    with _isolated(backend, candidate.device), warnings.catch_warnings():
        # DataLoader's own warnings about the settings tried (worker counts, pickling): the report says what they would
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.utils\.data")
        step = TrainStep(family, uncompiled, backend, seed=0, fp32_host=_fp32.current(), init_scale=init_scale,
                         batch_size=batch_size if family.accepts_batch_size() else None)
        with step.selected():
            if threads is not None:
                torch.set_num_threads(threads)
            step_ms = _step_alone(step, setting_s)
            deadline = started + budget_s
            always = counts[:2] if counts[0] == 0 else counts[:1]  # no workers, and the most
            remaining = list(counts)
            while remaining:
                workers = remaining.pop(0)
                if time.perf_counter() > deadline and workers not in always:
                    break
                try:
                    trials += _trials(dataset, step, workers, _thread_counts(threads, workers, cores),
                                      batch_size=batch_size, pin=pin, method=method, fixed=fixed, setting_s=setting_s,
                                      prefetch=2 if workers else None, deadline=deadline)
                except _Unreceivable as exc:
                    if needs_workers:
                        raise DatasetError(_named(dataset), f"the fixed arguments need workers, and {exc}") from exc
                    trials.append(LoaderTrial(num_workers=workers, failure=str(exc)))
                    remaining = [w for w in remaining if w == 0]  # any other count's workers would fail the same way
                    continue
                if any(keeps_up(t, step_ms) and t.num_workers <= min(remaining, default=t.num_workers)
                       for t in trials):
                    break
            chosen = choose(trials, step_ms)
            if (chosen is not None and chosen.num_workers and not keeps_up(chosen, step_ms)
                    and "prefetch_factor" not in fixed and time.perf_counter() < deadline):
                trials += _trials(dataset, step, chosen.num_workers, [chosen.num_threads], batch_size=batch_size,
                                  pin=pin, method=method, fixed=fixed, setting_s=setting_s,
                                  prefetch=DEEP_PREFETCH, deadline=deadline)
                chosen = choose(trials, step_ms)
    if chosen is None:
        raise DatasetError(_named(dataset), "every setting was ruled out: " + "; ".join(
            f"num_workers={t.num_workers}: {t.failure}" for t in trials))
    workers = chosen.num_workers
    return LoaderReport(
        model_kind=model_kind, candidate=candidate, dataset=signature, batch_size=batch_size,
        num_workers=workers, pin_memory=pin, persistent_workers=bool(fixed.get("persistent_workers", workers > 0)),
        prefetch_factor=chosen.prefetch_factor, start_method=method,
        num_threads=chosen.num_threads if chosen.num_threads != threads else None,
        reason=loader_reason(chosen, trials, step_ms=step_ms, kept_up=keeps_up(chosen, step_ms),
                             workers_failed=workers_failed(trials)),
        step_ms=step_ms, trials=trials, measured_at=at, wall_s=time.perf_counter() - started, budget_s=budget_s,
    )


def _step_alone(step: TrainStep, setting_s: float) -> float:
    """ms per training step on the batch in memory, the steps overlapping as a loop's do."""
    step.run(2)  # warm-up
    count, started = 0, time.perf_counter()
    while count < MIN_BATCHES or time.perf_counter() - started < setting_s:
        step.run(1, synchronize=False)
        count += 1
    step.backend.synchronize(step.candidate.device)
    return (time.perf_counter() - started) * 1000 / count


def _trials(dataset: Any, step: TrainStep, workers: int, thread_counts: list[int | None], *, batch_size: int,
            pin: bool, method: str, fixed: Mapping[str, Any], setting_s: float, prefetch: int | None,
            deadline: float) -> list[LoaderTrial]:
    """Time the loop with ``workers`` at each training thread count (the first, and the others before the
    ``deadline``), on one loader: its workers persist between them. Raises :class:`_Unreceivable` when workers
    started by ``method`` cannot be started with the dataset."""
    kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": pin}
    if fixed.get("batch_sampler") is None:  # DataLoader refuses a batch size beside a batch sampler's batches
        kwargs["batch_size"] = batch_size
    if workers:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch, timeout=TIMEOUT_S)
    loader = DataLoader(dataset, **{**kwargs, **fixed})
    found: list[LoaderTrial] = []
    for threads in thread_counts:
        if found and time.perf_counter() > deadline:
            break
        trial = _trial(loader, step, workers, threads, method=method, setting_s=setting_s)
        found.append(trial.model_copy(update={"prefetch_factor": prefetch}))
        if trial.failure is not None:
            break
    del loader  # its workers end with it
    if found[-1].failure is not None and not found[-1].batches and method != "fork":
        # workers that died before their first batch, started by a method that pickles the dataset to them
        why = _unreceived(dataset, method)
        if why is not None:
            raise _Unreceivable(why)
    return found


def _trial(loader: DataLoader[Any], step: TrainStep, workers: int, threads: int | None, *, method: str,
           setting_s: float) -> LoaderTrial:
    """The loop over ``loader`` with ``threads`` training threads: ``workers`` batches to warm up (the first waits
    for the workers' start, the others were loaded meanwhile), then timed."""
    if threads is not None:
        torch.set_num_threads(threads)
    asked = time.perf_counter()
    batches: Iterator[Any]
    try:
        batches = iter(loader)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:  # what DataLoader's worker start raises
        if workers:
            raise _Unreceivable(_cannot_receive(method, f"{type(exc).__name__}: {exc}")) from exc
        raise
    start_s: float | None = None
    count = timed = 0
    waited_s = 0.0
    clock = asked
    try:
        while True:
            before = time.perf_counter()
            batches, batch = _next(loader, batches, workers, count)
            got = time.perf_counter()
            if start_s is None:
                start_s = got - asked
            del batch
            step.run(1, synchronize=False)
            count += 1
            if count == workers:
                step.backend.synchronize(step.candidate.device)
                clock = time.perf_counter()
            elif count > workers:
                waited_s += got - before
                timed += 1
                spent_s = time.perf_counter() - clock
                if spent_s >= setting_s * (1 if timed >= MIN_BATCHES else SLOW_SETTINGS):
                    break
    except _RuledOut as exc:
        return LoaderTrial(num_workers=workers, num_threads=threads, start_s=start_s, batches=count,
                           failure=str(exc))
    step.backend.synchronize(step.candidate.device)
    elapsed_s = time.perf_counter() - clock
    return LoaderTrial(num_workers=workers, num_threads=threads, loop_ms=elapsed_s * 1000 / timed,
                       data_wait_share=waited_s / elapsed_s, start_s=start_s, batches=count)


class _RuledOut(Exception):
    """A worker died or went silent: this setting is ruled out."""


def _next(loader: DataLoader[Any], batches: Iterator[Any], workers: int, count: int) -> tuple[Iterator[Any], Any]:
    """The next batch, a new epoch's first after the last (its start is the loop's too)."""
    try:
        try:
            return batches, next(batches)
        except StopIteration:
            batches = iter(loader)
            return batches, next(batches)
    except RuntimeError as exc:
        first = str(exc).split("\n", 1)[0]
        if workers and first.startswith("DataLoader worker"):  # it died: what it said, if anything, is on stderr
            raise _RuledOut(f"{first[:200]}; its own error, if any, is on stderr") from exc
        if workers and first.startswith("DataLoader timed out"):
            raise _RuledOut(first[:200]) from exc
        raise _raised(loader, exc, workers, count) from exc
    except Exception as exc:  # the dataset's own code (or its collate_fn): surfaced with where it happened
        raise _raised(loader, exc, workers, count) from exc


def _unreceived(dataset: Any, method: str) -> str | None:
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
    return None if unpickled is None else _cannot_receive(method, unpickled)


def _receive(payload: bytes, sending: Connection) -> None:
    """In a process started as a worker is: unpickle the dataset, and send back what that raised (None: nothing)."""
    try:
        pickle.loads(payload)
    except Exception as exc:  # whatever unpickling the user's dataset raises is the workers' cause
        sending.send(f"{type(exc).__name__}: {exc}"[:300])
    else:
        sending.send(None)


def _cannot_receive(method: str, why: str) -> str:
    return (f"worker processes started by {method} cannot receive the dataset ({why[:300]}): define its class and "
            "what it holds in a module they can import, no lambdas or nested functions")


def _raised(loader: DataLoader[Any], exc: BaseException, workers: int, count: int) -> DatasetError:
    # from a worker, DataLoader raises the same type with the worker's traceback: its last line is the message
    message = str(exc).strip().split("\n")[-1].removeprefix(f"{type(exc).__name__}: ")[:300]
    return DatasetError(_named(loader.dataset), f"loading batch {count + 1} at num_workers={workers} raised "
                        f"{type(exc).__name__}: {message}")


# -- the settings ---------------------------------------------------------------------------------------------


def _most_workers(cores: int, processes: int) -> int:
    """The most workers measured, e.g. 2 in a ``--cpus=2`` container on a 96-core host: one per core this process
    may use (``cores``: its affinity, its CPU quota, its share in a job of ``processes``), no more than fit in
    ``MEMORY_SHARE`` of the memory available to its share, each counted at this process's own resident memory (a
    forked worker comes to hold what it writes of it, Python's reference counts included; a spawned one imports
    torch and the dataset again); at least one. Where the memory is not known (not Linux), the cores alone."""
    available = backend_for("cpu").free_memory_bytes("cpu")
    worker_bytes = _linux.anonymous_bytes()
    if available is None or not worker_bytes:
        return max(1, cores)
    return max(1, min(cores, int(available * MEMORY_SHARE / processes) // worker_bytes))


def _worker_counts(most: int, batches: int, fixed: int | None, *, zero: bool) -> list[int]:
    """The worker counts in the order they are measured: none, the most (``most``, fewer where there are fewer
    batches), then the ones between, fewest first."""
    if fixed is not None:
        return [fixed]
    most = max(1, min(most, batches))
    between = sorted({2**i for i in range(most.bit_length()) if 2**i < most})
    return [*([0] if zero else []), most, *between]


def _thread_counts(threads: int | None, workers: int, cores: int) -> list[int | None]:
    """The training's CPU threads to measure with ``workers``: fewer where the workers would leave the training
    fewer of its ``cores`` (first: oversubscribed cores stall every parallel region), then the config's; the
    accelerators' are left as they are."""
    if threads is None or not workers:
        return [threads]
    fewer = max(1, min(threads, cores - workers))
    return [threads] if fewer == threads else [fewer, threads]


def _start_method(fixed: Mapping[str, Any]) -> str:
    """How the user's DataLoader will start its workers, e.g. ``'fork'``: by the ``multiprocessing_context`` fixed,
    else by this program's default. The measurement passes none of its own: forked workers in a process that
    trains on CUDA are PyTorch's normal case (they do CPU work), and spawn would lose the datasets and transforms
    defined in ``__main__`` that the user's loop loads."""
    given = fixed.get("multiprocessing_context")
    if given is not None:
        return given if isinstance(given, str) else str(given.get_start_method())
    # the first of get_all_start_methods() is the platform's default; get_start_method() would fix it for good
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


@contextlib.contextmanager
def _isolated(backend: Backend, device: str) -> Iterator[None]:
    """The caller's random streams, fp32 settings and thread count as they were, whatever the measurement did."""
    threads = torch.get_num_threads()
    index = torch.device(device).index
    devices = [index or 0] if backend.device_type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), _fp32.preserved():
            yield
    finally:
        torch.set_num_threads(threads)


# -- checking and describing ----------------------------------------------------------------------------------


def _validate(batch_size: object, key: object, fixed: Mapping[str, Any], budget_s: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError("batch_size", batch_size, "a positive int")
    if key is not None and not isinstance(key, str):
        raise ConfigurationError("key", key, "a str naming this dataset's version, or None")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s < math.inf:
        raise ConfigurationError("budget_s", budget_s, "seconds > 0")
    known = [name for name in inspect.signature(DataLoader).parameters if name not in _NOT_FIXED]
    for name in fixed:
        if name not in known:
            raise ConfigurationError(name, fixed[name], "a DataLoader keyword: " + ", ".join(known))
    workers = fixed.get("num_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigurationError("num_workers", workers, "an int >= 0")
    if fixed.get("batch_sampler") is not None:
        for name in ("shuffle", "sampler", "drop_last"):
            if fixed.get(name) not in (None, False):
                raise ConfigurationError(name, fixed[name], f"no {name} beside batch_sampler=, whose batches are "
                                         "the loader's (DataLoader's rule): set it in the batch sampler")


def _named(dataset: Any) -> str:
    """e.g. ``'my_app.data.Photos'``"""
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}"


def _structure(sample: Any, depth: int = 0, *, sized: bool = True) -> str:
    """One sample's structure, e.g. ``'(Tensor[float32, 3x64x64], int)'``; ``sized=False``: its arrays' ranks
    instead of their sizes, e.g. ``'(Tensor[float32, 3-d], int)'``."""
    shape, dtype = getattr(sample, "shape", None), getattr(sample, "dtype", None)
    if shape is not None and dtype is not None:
        dims = ("x".join(str(d) for d in shape) if sized else f"{len(shape)}-d") if len(shape) else "scalar"
        return f"{type(sample).__name__}[{str(dtype).removeprefix('torch.')}, {dims}]"
    if depth >= 3:
        return type(sample).__name__
    if isinstance(sample, Mapping):
        items = sorted(sample.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{k}: {_structure(v, depth + 1, sized=sized)}" for k, v in items[:8]) + \
            (", ..." if len(items) > 8 else "") + "}"
    if isinstance(sample, (tuple, list)):
        inner = ", ".join(_structure(v, depth + 1, sized=sized) for v in sample[:8]) + \
            (", ..." if len(sample) > 8 else "")
        return f"({inner})" if isinstance(sample, tuple) else f"[{inner}]"
    return type(sample).__name__


def _described(fixed: Mapping[str, Any]) -> str:
    """The fixed arguments as they identify a question across runs, by what they are rather than their address, e.g.
    ``"collate_fn=functools.partial(my_app.data.pad, value=0),shuffle=True"``."""
    return ",".join(f"{name}={_what(fixed[name])}" for name in sorted(fixed))


def _what(value: Any, depth: int = 0) -> str:
    """A function, class or method by its name; a ``partial`` by its function and arguments; any other object (a
    callable instance, a sampler) by its class."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, functools.partial) and depth < 3:
        arguments = [_what(v, depth + 1) for v in value.args]
        arguments += [f"{k}={_what(v, depth + 1)}" for k, v in sorted(value.keywords.items())]
        return f"functools.partial({', '.join([_what(value.func, depth + 1), *arguments])})"
    named = value if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)) \
        else type(value)
    return f"{named.__module__}.{named.__qualname__}"


__all__ = [
    "BUDGET_S", "DEEP_PREFETCH", "KEEP_UP", "MEASUREMENT_VERSION", "MEMORY_SHARE", "MIN_BATCHES", "SETTING_SHARE",
    "TIMEOUT_S", "choose", "dataset_signature", "keeps_up", "report", "workers_failed",
]
