"""DataLoader settings measured against the training step's time, for one dataset: ``cfg.dataloader_kwargs(dataset,
batch_size=64)``.

For about ``BUDGET_S`` seconds it runs the loop as the user runs it, but for the step: the user's dataset in a
DataLoader, each batch copied to the config's device and followed by the step time calibration recorded for the
config (``stand_in``), one setting after another. No model is built; nothing of the caller's process changes
(``apart``). Without a recorded step time (a Config made by hand or by heuristic) the loader is measured alone.

The settings tried (``workers``): none, then the most workers, then the counts between; on the CPU each with the
config's training threads and with fewer. Each is timed from its steady rate, over at least two of each worker's
batches and ``SETTING_SHARE`` of the budget, reading on where the last left off. A loop within ``KEEP_UP`` of its
step keeps up: the cheapest setting that keeps up wins (costlier ones are not measured), else the fastest. Where
batches load slowly, the loop without workers tells how long the most workers' windows take, and the budget grows to
that (logged); a setting starts only where its window fits the budget, and the report says what the measurement cost.

A setting whose workers die or stay silent is ruled out, with the cause where one is found; an answer without
workers because none could run is not kept; a dataset that raises surfaces as a :class:`DatasetError` and nothing
is cached. Answers are kept per machine configuration, family, candidate and question
(``autotune._cache.loader_answers``): the dataset by its type, length and first sample's structure without sizes,
the fixed arguments by what they are.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import logging
import math
import pickle
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune._cache.loader_answers import Answers
from autotune._errors import ConfigurationError, DatasetError
from autotune._families import get_family
from autotune._fingerprint import default_threads
from autotune._loop_wording import loader_reason
from autotune._quota import usable_cores
from autotune._records import Candidate
from autotune._reports import LoaderReport, LoaderTrial
from autotune._tools import workers as _workers
from autotune._tools.apart import Continuing, Silent, Tick, apart, sampling, untouched
from autotune._tools.question import dataset_signature, described, named
from autotune._tools.stand_in import StandIn
from autotune._variants import CPU, threads_per_process
from autotune.backends import backend_for, resolve_device

log = logging.getLogger("autotune")

#: the measurement's length in seconds: no setting starts after it, but for no workers and the most workers
BUDGET_S = 5.0
#: each setting's loop is timed over at least this share of the budget (and two periods of its workers' wave)
SETTING_SHARE = 0.1
#: a loop at most this much slower per step than its step keeps up: without workers, its own steps (nothing else
#: shares the cores, and the comparison is within one timed loop); with workers, the step alone (they may slow it)
KEEP_UP = 0.10
#: a deeper prefetch tried for a winner that does not keep up: it absorbs uneven batches, not slow ones
DEEP_PREFETCH = 4
#: the prefetch_factor measured first (DataLoader's default)
_PREFETCH = 2
#: bumped when what a stored answer means changes (2: workers start as the user's DataLoader starts them; the
#: dataset is keyed without its sample's sizes, the fixed arguments by what they are; 3: the step is the recorded
#: step time, each setting timed over two periods of its workers' wave, the copy to the device included)
MEASUREMENT_VERSION = 3

#: the DataLoader keywords ``fixed`` may not hold: the dataset and the batch size are arguments of their own
_NOT_FIXED = ("dataset", "batch_size")
#: the fixed keywords measured through copies (``apart.sampling``), never passed as they are
_SAMPLING = ("sampler", "batch_sampler", "shuffle", "generator")


def report(candidate: Candidate, model_kind: str, digest: str, dataset: Any, *, batch_size: int, key: str | None,
           fixed: Mapping[str, Any], step_ms: float | None, budget_s: float = BUDGET_S, force: bool = False,
           processes: int = 1) -> LoaderReport:
    """The DataLoader settings that measured fastest for ``candidate`` training ``model_kind`` on ``dataset``, from
    the answers of this machine configuration (``digest``) when this question was measured before. ``step_ms``:
    the step time calibration recorded for the candidate, at the family's own batch (None: not known).
    ``processes``: the job's processes on this machine, each loading with its share of the cores (its workers and
    its training threads beside the others')."""
    _validate(batch_size, key, fixed, budget_s)
    method = _workers.start_method(fixed)
    signature, keyed, length = dataset_signature(dataset, method=method)
    family = get_family(model_kind)
    question = "|".join([family.name, family.ref, family.version or "", candidate.label,
                         keyed, f"batch {batch_size}", key or "", described(fixed), f"v{MEASUREMENT_VERSION}"])
    answers = Answers(digest)
    if not force and (known := answers.get(question)) is not None:
        return known
    cores = threads_per_process(usable_cores(), processes)
    measured = _measure(candidate, model_kind, dataset, signature, length, batch_size=batch_size, fixed=fixed,
                        method=method, step_ms=step_at(step_ms, family.default_batch_size(), batch_size),
                        budget_s=budget_s, cores=cores, most_workers=_workers.most_workers(cores, processes))
    if workers_failed(measured.trials):
        # the user's loop would lose its workers the same way until the cause is fixed: not kept as the best
        log.warning("%s: %s", model_kind, measured.reason)
        return measured
    log.info("%s: %s", model_kind, measured.reason)
    answers.put(question, measured)
    return measured


def step_at(step_ms: float | None, recorded_batch: int | None, batch_size: int) -> float | None:
    """The step time at ``batch_size``, e.g. 20.0 for 40 ms recorded at batch 64 and a loader's batch of 32: in
    proportion to the batch where the recorded one is known, as recorded where it is not (a family whose build takes
    no ``batch_size`` trains at its one batch size); None where none was recorded."""
    if step_ms is None or recorded_batch is None:
        return step_ms
    return step_ms * batch_size / recorded_batch


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


# -- measuring ------------------------------------------------------------------------------------------------


class _Unreceivable(Exception):
    """Worker processes cannot be started with the dataset: the message says why and what to do."""


def _measure(candidate: Candidate, model_kind: str, dataset: Any, signature: str, length: int, *, batch_size: int,
             fixed: Mapping[str, Any], method: str, step_ms: float | None, budget_s: float, cores: int,
             most_workers: int) -> LoaderReport:
    started = time.perf_counter()
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        resolve_device(candidate.device)
    except LookupError as exc:
        raise ConfigurationError("device", candidate.device, "a device this process can use", why=(
            f"{exc}; the DataLoader is measured copying its batches to this Config's device: ask on the machine "
            "that trains")) from exc
    backend = backend_for(candidate.device)
    threads = (candidate.num_threads or default_threads()) if backend.device_type == CPU else None
    pin = bool(fixed.get("pin_memory", backend.async_copies))
    drop_last = bool(fixed.get("drop_last", False))
    batches = length // batch_size if drop_last else math.ceil(length / batch_size)
    if batches == 0:
        raise DatasetError(named(dataset), f"drop_last=True leaves no batch of {batch_size} from {length} samples")
    needs_workers = fixed.get("num_workers", 0) > 0 or any(
        fixed.get(name) not in (None, False) for name in ("multiprocessing_context", "persistent_workers",
                                                          "prefetch_factor"))
    counts = _workers.worker_counts(most_workers, batches, fixed.get("num_workers"), zero=not needs_workers)
    setting_s = budget_s * SETTING_SHARE
    step = step_ms or 0.0  # unknown: the loader alone, and the fastest wins
    trials: list[LoaderTrial] = []
    with untouched(), warnings.catch_warnings():
        # DataLoader's own warnings about the settings tried (worker counts, pickling): the report says what they would
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.utils\.data")
        stand_in = StandIn(step_ms=step, device=candidate.device, backend=backend, threads=threads, pin=pin)
        loading = {**{k: v for k, v in fixed.items() if k not in _SAMPLING},
                   **sampling(dataset, fixed, batch_size=batch_size, length=length)}
        if "batch_sampler" not in loading:  # DataLoader refuses a batch size beside a batch sampler's batches
            loading["batch_size"] = batch_size
        timing = functools.partial(_trials, dataset, stand_in, loading=loading, pin=pin, method=method,
                                   setting_s=setting_s)
        always = counts[:2] if counts[0] == 0 else counts[:1]  # no workers, and the most
        remaining = list(counts)
        load_s = 0.0  # a batch's loading on one thread, once the loop without workers has told it
        count_s = 0.0  # what a thread count of the last worker setting cost beyond its window: its workers' start
        while remaining:
            workers = remaining.pop(0)
            tried = _workers.thread_counts(threads, workers, cores)
            if workers not in always and time.perf_counter() + len(tried) * count_s + _window_s(
                    workers, len(tried), load_s=load_s, step_s=step / 1000, setting_s=setting_s) > started + budget_s:
                break
            before = time.perf_counter()
            if workers == 0:
                trials.append(_alone(dataset, stand_in, loading, threads=threads, method=method,
                                     setting_s=setting_s))
                if trials[-1].loop_ms is not None:
                    load_s = max(0.0, trials[-1].loop_ms - step) / 1000
                    budget_s = _stated(budget_s, time.perf_counter() - started, _window_s(
                        max(counts), len(_workers.thread_counts(threads, max(counts), cores)), load_s=load_s,
                        step_s=step / 1000, setting_s=setting_s))
            else:
                try:
                    trials += timing(workers, tried, prefetch=_PREFETCH, deadline=started + budget_s)
                    count_s = max(0.0, (time.perf_counter() - before) / len(tried) - _window_s(
                        workers, 1, load_s=load_s, step_s=step / 1000, setting_s=setting_s))
                except _Unreceivable as exc:
                    if needs_workers:
                        raise DatasetError(named(dataset), f"the fixed arguments need workers, and {exc}") from exc
                    trials.append(LoaderTrial(num_workers=workers, failure=str(exc)))
                    break  # any other count's workers would fail the same way
            if any(keeps_up(t, step) and t.num_workers <= min(remaining, default=t.num_workers) for t in trials):
                break
        chosen = choose(trials, step)
        if (chosen is not None and chosen.num_workers and not keeps_up(chosen, step)
                and "prefetch_factor" not in fixed and time.perf_counter() + _window_s(
                    chosen.num_workers, 1, load_s=load_s, step_s=step / 1000, setting_s=setting_s)
                <= started + budget_s):
            trials += timing(chosen.num_workers, [chosen.num_threads], prefetch=DEEP_PREFETCH,
                             deadline=started + budget_s)
            chosen = choose(trials, step)
    if chosen is None:
        raise DatasetError(named(dataset), "every setting was ruled out: " + "; ".join(
            f"num_workers={t.num_workers}: {t.failure}" for t in trials))
    workers, wall_s = chosen.num_workers, time.perf_counter() - started
    return LoaderReport(
        model_kind=model_kind, candidate=candidate, dataset=signature, batch_size=batch_size,
        num_workers=workers, pin_memory=pin, persistent_workers=bool(fixed.get("persistent_workers", workers > 0)),
        prefetch_factor=chosen.prefetch_factor, start_method=method,
        num_threads=chosen.num_threads if chosen.num_threads != threads else None,
        reason=loader_reason(chosen, trials, step_ms=step_ms, kept_up=keeps_up(chosen, step),
                             workers_failed=workers_failed(trials), wall_s=wall_s, budget_s=budget_s),
        step_ms=step_ms, trials=trials, measured_at=at, wall_s=wall_s, budget_s=budget_s,
    )


def _window_s(workers: int, thread_counts: int, *, load_s: float, step_s: float, setting_s: float) -> float:
    """About how long ``workers`` take to be timed at ``thread_counts`` training thread counts: per count (each an
    epoch of its own) their first wave (a batch's loading), then two periods of their wave (each worker's next two
    batches, or the steps that consume them) and at least ``setting_s``; between counts and at the end, the batches
    the workers prefetched, which they load before they start the next epoch or stop."""
    window = thread_counts * (load_s + max(setting_s, 2 * max(load_s, workers * step_s)))
    return window + ((thread_counts - 1) * _PREFETCH + 1) * load_s


def _stated(budget_s: float, elapsed_s: float, most_s: float) -> float:
    """The budget once the loop without workers has run: what the most workers need to be timed, where that is
    more than the budget left (slow batches), said in the log."""
    if elapsed_s + most_s <= budget_s:
        return budget_s
    stated = math.ceil(elapsed_s + most_s)
    log.info("measuring DataLoader settings for about %d s, not %g: batches this slow need that long for two "
             "periods of the workers' wave", stated, budget_s)
    return float(stated)


@dataclasses.dataclass(frozen=True)
class _Loaded:
    """The loop without workers, apart from its step: ms per batch loaded, the batches loaded (the first not
    timed), the seconds until the first, how far the sampler got, and the first batch where its copy is timed."""

    load_ms: float
    batches: int
    start_s: float
    taken: int
    batch: Any


def _alone(dataset: Any, stand_in: StandIn, loading: Mapping[str, Any], *, threads: int | None, method: str,
           setting_s: float) -> LoaderTrial:
    """The loop without workers: its loading, timed apart; its first batch's copy, timed here; its step's time."""
    order: Continuing = loading["sampler"] if "sampler" in loading else loading["batch_sampler"]
    kwargs = {**loading, "num_workers": 0, "pin_memory": False}  # the copy is timed here, pinned where it would be
    try:
        loaded = apart(functools.partial(_load, kwargs=kwargs, setting_s=setting_s, keep=not stand_in.on_cpu),
                       dataset, method=method, silent_s=_workers.TIMEOUT_S)
    except Silent as exc:
        return LoaderTrial(num_workers=0, num_threads=threads, failure=f"loading without workers: {exc}")
    order.skip_to(loaded.taken)
    loop_ms = loaded.load_ms + stand_in.copy_ms(loaded.batch) + stand_in.step_ms
    return LoaderTrial(num_workers=0, num_threads=threads, loop_ms=loop_ms,
                       data_wait_share=loaded.load_ms / loop_ms if loop_ms else 0.0, start_s=loaded.start_s,
                       batches=loaded.batches)


def _load(dataset: Any, tick: Tick, *, kwargs: Mapping[str, Any], setting_s: float, keep: bool) -> _Loaded:
    """Load batches without workers, the first untimed, then at least two over at least ``setting_s``."""
    loader = DataLoader(dataset, **kwargs)
    asked = time.perf_counter()
    batches: Iterator[Any] = iter(loader)
    count = timed = 0
    load_s = start_s = clock = 0.0
    kept = None
    while True:
        before = time.perf_counter()
        batches, batch = _next(loader, batches, 0, count)
        got = time.perf_counter()
        tick()
        if count == 0:
            start_s, clock, kept = got - asked, got, batch if keep else None
        else:
            load_s += got - before
            timed += 1
        count += 1
        if timed >= 2 and got - clock >= setting_s:
            break
    order: Continuing = kwargs["sampler"] if "sampler" in kwargs else kwargs["batch_sampler"]
    return _Loaded(load_ms=load_s * 1000 / timed, batches=count, start_s=start_s, taken=order.taken, batch=kept)


def _trials(dataset: Any, stand_in: StandIn, workers: int, thread_counts: list[int | None], *,
            loading: Mapping[str, Any], pin: bool, method: str, setting_s: float, prefetch: int,
            deadline: float) -> list[LoaderTrial]:
    """Time the loop with ``workers`` at each training thread count (the first, and the others before the
    ``deadline``), on one loader: its workers persist between them. Raises :class:`_Unreceivable` when workers
    started by ``method`` cannot be started with the dataset."""
    kwargs = {"num_workers": workers, "pin_memory": pin, "persistent_workers": True, "prefetch_factor": prefetch,
              "timeout": _workers.TIMEOUT_S}
    loader = DataLoader(dataset, **{**kwargs, **loading})
    found: list[LoaderTrial] = []
    for threads in thread_counts:
        if found and time.perf_counter() > deadline:
            break
        trial = _trial(loader, stand_in, workers, threads, method=method, setting_s=setting_s)
        found.append(trial.model_copy(update={"prefetch_factor": prefetch}))
        if trial.failure is not None:
            break
    del loader  # its workers end with it
    if found[-1].failure is not None and not found[-1].batches and method != "fork":
        # workers that died before their first batch, started by a method that pickles the dataset to them
        why = _workers.unreceived(dataset, method)
        if why is not None:
            raise _Unreceivable(why)
    return found


def _trial(loader: DataLoader[Any], stand_in: StandIn, workers: int, threads: int | None, *, method: str,
           setting_s: float) -> LoaderTrial:
    """The loop over ``loader`` with ``threads`` training threads, timed from its steady rate: after the first
    ``workers`` batches (every worker's first, which waits for its start), over at least ``2 * workers`` more (each
    worker's next two: two periods of the wave they load side by side) and ``setting_s``."""
    if threads is not None:
        torch.set_num_threads(threads)
    asked = time.perf_counter()
    batches: Iterator[Any]
    try:
        batches = iter(loader)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:  # what DataLoader's worker start raises
        raise _Unreceivable(_workers.cannot_receive(method, f"{type(exc).__name__}: {exc}")) from exc
    except AssertionError as exc:  # multiprocessing's own: a daemonic process (a Pool's) may start no workers
        return LoaderTrial(num_workers=workers, num_threads=threads, failure=str(exc))
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
            stand_in.copy(batch)
            del batch
            stand_in.run()
            count += 1
            if count == workers:
                clock = time.perf_counter()
            elif count > workers:
                waited_s += got - before
                timed += 1
                if timed >= 2 * workers and time.perf_counter() - clock >= setting_s:
                    break
    except _RuledOut as exc:
        return LoaderTrial(num_workers=workers, num_threads=threads, start_s=start_s, batches=count,
                           failure=str(exc))
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


def _raised(loader: DataLoader[Any], exc: BaseException, workers: int, count: int) -> DatasetError:
    # from a worker, DataLoader raises the same type with the worker's traceback: its last line is the message
    message = str(exc).strip().split("\n")[-1].removeprefix(f"{type(exc).__name__}: ")[:300]
    return DatasetError(named(loader.dataset), f"loading batch {count + 1} at num_workers={workers} raised "
                        f"{type(exc).__name__}: {message}")


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
    if fixed.get("sampler") is not None and fixed.get("shuffle"):
        raise ConfigurationError("shuffle", fixed["shuffle"], "no shuffle beside sampler=, which orders the samples "
                                 "(DataLoader's rule): shuffle in the sampler")
    if fixed.get("batch_sampler") is not None:
        for name in ("shuffle", "sampler", "drop_last"):
            if fixed.get(name) not in (None, False):
                raise ConfigurationError(name, fixed[name], f"no {name} beside batch_sampler=, whose batches are "
                                         "the loader's (DataLoader's rule): set it in the batch sampler")


__all__ = [
    "BUDGET_S", "DEEP_PREFETCH", "KEEP_UP", "MEASUREMENT_VERSION", "SETTING_SHARE",
    "choose", "keeps_up", "report", "step_at", "workers_failed",
]
