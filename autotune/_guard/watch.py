"""The guard in the training loop: it watches the measured configuration over the thousands of steps that
calibration's short verification cannot see, and demotes it on this machine when it misbehaves.

Each ``step`` copies the loss (and the loss scale) into a device buffer allocated once, with no synchronization;
every ``READ_EVERY_STEPS`` steps the buffer is read at once and the rules run on the host. A finding needs
evidence, not one bad batch: ``NON_FINITE_LOSSES`` non-finite losses within ``WINDOW_STEPS``; GradScaler's own
record of skipped steps (once the scale has held ``SETTLED_STEPS``: ``SKIPPED_STEPS`` back-offs within
``WINDOW_STEPS``, a back-off being its skips in a row, one however many steps it skips, or more than
``BACKOFF_SKIPS`` in a row, one it does not recover from; before that, an early back-off of more than
``BACKOFF_SKIPS``); or ``DIVERGED_BLOCKS`` medians of ``BLOCK_STEPS`` losses in a row that gave back more than
``GIVE_BACK`` of the progress from start to floor (once it reached ``MIN_PROGRESS``). ``SLOW_BLOCKS`` reads in a
row at ``SLOW_FACTOR`` times the run's fastest pace only warn. fp32 on the CPU, the reference, is never demoted.

``data(loader)`` times each wait for a batch on the host, between the batches the loop asks for (no
synchronization): a loop that waits for data over ``DATA_WAIT_SHARE`` of its time in ``DATA_WAIT_WINDOWS`` windows
of ``read_every`` batches in a row gets one WARNING, and each pass's summary is kept for its family.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import statistics
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import torch
from torch import nn

from autotune._cache import demotions as _demotions
from autotune._cache import loops as _loops
from autotune._errors import ConfigMisbehaved, ConfigurationError
from autotune._guard.answer import Answer, Answered
from autotune._guard.model import family_model, model_signature
from autotune._guard.replay import LossFn, Tape
from autotune._loop_wording import data_bound_words, replay_words
from autotune._records import FP32_CPU, Candidate, Demotion, Misbehaviour, Prefer, Record, Replay
from autotune._reports import LoopSummary
from autotune._version import __version__

if TYPE_CHECKING:
    from autotune._ranks.group import JobGroup

log = logging.getLogger("autotune")

OnFailure = Literal["warn", "raise"]
Batch = TypeVar("Batch")

#: steps between two reads of the device buffer (one synchronization each)
READ_EVERY_STEPS = 50
#: the window the non-finite and skipped-step counts are taken over
WINDOW_STEPS = 100
NON_FINITE_LOSSES = 3
#: back-offs of GradScaler (its skips in a row) within the window
SKIPPED_STEPS = 4
#: steps in a row without a skip after which GradScaler's early back-off is over
SETTLED_STEPS = 20
BACKOFF_SKIPS = 24
BLOCK_STEPS = 50
GIVE_BACK = 0.5
MIN_PROGRESS = 0.1
DIVERGED_BLOCKS = 3
SLOW_FACTOR = 2.0
SLOW_BLOCKS = 5
#: a read over less time than this is not judged for pace: at that scale the timer and the scheduler are the noise
PACE_MIN_READ_MS = 20.0
#: a loop that waits for data over this share of its time for ``DATA_WAIT_WINDOWS`` windows in a row is data-bound:
#: a loader that kept up would make it at least 1 / (1 - 0.25) = 1.33x faster
DATA_WAIT_SHARE = 0.25
DATA_WAIT_WINDOWS = 3
#: in a job, a replay stops at this share of the time the other ranks wait for it in the loop
#: (AUTOTUNE_RANKS_LOOP_TIMEOUT_S)
REPLAY_JOB_SHARE = 0.5

_ON_FAILURE: tuple[OnFailure, ...] = ("warn", "raise")


def _within_window(seen: deque[tuple[int, float]], step: int, value: float) -> list[int]:
    """Add ``(step, value)`` to ``seen``, forget what is ``WINDOW_STEPS`` or more behind it; the steps left."""
    seen.append((step, value))
    while seen[0][0] <= step - WINDOW_STEPS:
        seen.popleft()
    return [s for s, _ in seen]


def is_reference(candidate: Candidate) -> bool:
    """fp32 on the CPU, whatever its variants: what every candidate is verified against, never demoted."""
    return candidate.base == FP32_CPU


class Guard(Generic[Answered]):
    """Watches one training run of ``model_kind`` on ``candidate``; made by ``Config.guard()``.

    ``finding`` is the first misbehaviour seen (None while there is none), its ``replay`` whose doing it was; after
    it the guard stops watching. With ``model``, ``optimizer`` and ``loss_fn`` (``loss_fn(model, batch)`` -> the
    loss, as the loop computes it) and each step's ``batch``, a finding is replayed before anything is demoted.
    In a ``job`` of many processes the ranks compare at each read: the first rank's finding is every rank's.
    ``answer`` is what :meth:`fallback` asks again: ``autotune.best_config``, which ``Config.guard()`` gives it; a
    guard made by hand without it watches as well, and its :meth:`fallback` raises :class:`ConfigurationError`.
    """

    def __init__(self, model_kind: str, candidate: Candidate, digest: str, *, on_failure: OnFailure = "warn",
                 read_every: int = READ_EVERY_STEPS, model: nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, loss_fn: LossFn | None = None,
                 step_ms: float | None = None, speedup: float | None = None, job: JobGroup | None = None,
                 answer: Answer[Answered] | None = None) -> None:
        if on_failure not in _ON_FAILURE:
            raise ConfigurationError("on_failure", on_failure, " | ".join(_ON_FAILURE))
        if isinstance(read_every, bool) or not isinstance(read_every, int) or read_every < 1:
            raise ConfigurationError("read_every", read_every, "a positive int")
        self.model: nn.Module | None = None
        self._tape: Tape | None = None
        self.job = job
        self.answer = answer
        if model is not None and optimizer is not None and loss_fn is not None:
            self.watch(model, optimizer, loss_fn)
        elif model is not None or optimizer is not None or loss_fn is not None:
            given = {"model": model, "optimizer": optimizer, "loss_fn": loss_fn}
            missing = ", ".join(name for name, v in given.items() if v is None)
            raise TypeError(f"a guard replays a finding with the model, its optimizer and loss_fn(model, batch) "
                            f"together; {missing} missing: cfg.guard(model, optimizer, loss_fn=...)")
        self._scaler: torch.amp.GradScaler | None = None
        self._window_dropped = False
        self.model_kind = model_kind
        self.candidate = candidate
        self.digest = digest
        self.on_failure = on_failure
        self.read_every = read_every
        self._finder: int | None = None  # in a job, the rank whose finding it is
        self.steps = 0
        self.finding: Demotion | None = None
        self._buffer: torch.Tensor | None = None  # row 0: losses, row 1: loss scales (NaN: no scaler)
        self._slots: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._filled = 0
        self._read_at = time.perf_counter()
        # what the rules remember between reads, on the host
        self._non_finite: deque[tuple[int, float]] = deque()
        self._last_finite: float | None = None
        self._scale: float | None = None
        self._skips: deque[tuple[int, float]] = deque()
        self._backoff: list[float] = []
        self._in_a_row: list[float] = []  # the scale at each skip of the back-off under way
        self._clean_run = 0
        self._settled = False
        self._block: list[float] = []
        self._block_start = 1
        self._medians: list[float] = []
        self._diverging: list[tuple[int, float]] = []
        self._fastest_ms = math.inf
        self._last_step_ms: float | None = None  # the run's time per step at the last timed read
        self._slow_reads = 0
        self._warned_slow = False
        # the loop's time as data() sees it: what calibration measured of the step, to set it beside
        self.measured_step_ms = step_ms
        self.speedup = speedup
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
        self._batches = 0
        self._wait_ms = 0.0
        self._step_ms = 0.0
        self._window_wait_ms = self._window_ms = 0.0
        self._window_batches = 0
        self._waiting_windows = 0
        self._warned_data = False
        self._data_batch: Any = None  # the batch data() handed the loop last, for a replay

    def watch(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn) -> Guard[Answered]:
        """Watch ``model``, trained by ``optimizer``: a finding is replayed with ``loss_fn(model, batch)`` on the
        batches ``step`` is given before anything is demoted. For a guard made before the model (a callback's)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be a function (model, batch) -> loss, got {type(loss_fn).__name__}")
        self.model = model
        self._tape = Tape(model, optimizer, loss_fn, ranks=self.job.ranks.local_world_size if self.job else 1)
        return self

    def step(self, loss: torch.Tensor | float, scaler: torch.amp.GradScaler | None = None, *,
             batch: Any = None) -> None:
        """Record one training step: its loss and, with fp16, the GradScaler (call it after ``scaler.update()``);
        ``batch``, the inputs ``loss_fn`` takes, for a replay (the guard keeps a reference to recent ones); inside
        ``for batch in guard.data(loader):``, the batch ``data`` handed the loop unless given."""
        if isinstance(loss, torch.Tensor) and loss.numel() != 1:
            raise ValueError(f"guard.step takes the step's loss, one value; got a tensor of shape {tuple(loss.shape)}: "
                             "pass the loss you call backward() on (e.g. loss.mean())")
        self.steps += 1
        if self.finding is not None:
            return
        self._scaler = scaler
        if batch is None:
            batch = self._data_batch
        if self._tape is not None and batch is not None:
            self._tape.add(batch, self.steps, scaler)
        if self._buffer is None:
            # On the loss's device (else the scale's): a copy across devices would wait for them at every step.
            scale_device = scaler._get_scale_async() if scaler is not None and scaler.is_enabled() else None
            device = (loss.device if isinstance(loss, torch.Tensor) else scale_device.device
                      if isinstance(scale_device, torch.Tensor) else torch.device(FP32_CPU.device))
            self._buffer = torch.full((2, self.read_every), math.nan, dtype=torch.float32, device=device)
            self._slots = list(zip(self._buffer[0].unbind(), self._buffer[1].unbind(), strict=True))
        loss_slot, scale_slot = self._slots[self._filled]
        if isinstance(loss, torch.Tensor):
            loss_slot.copy_(loss.detach().reshape(()))  # a (1,)-shaped loss (DataParallel's) too
        else:
            loss_slot.fill_(loss)
        if scaler is not None and scaler.is_enabled():
            # The scale tensor itself: get_scale() would wait for the device at every step. _get_scale_async is
            # GradScaler's own accessor for it (torch.amp.grad_scaler).
            scale = scaler._get_scale_async()
            if scale is not None:
                scale_slot.copy_(scale)
        self._filled += 1
        if self._filled == self.read_every:
            self._read(timed=True)

    def check(self) -> Demotion | None:
        """Read what the buffer holds now (one synchronization) and judge it: at the end of an epoch or of training."""
        if self.finding is None and self._filled:
            self._read(timed=False)
        self._keep_summary()
        return self.finding

    def data(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        """``for batch in guard.data(loader):`` the loader's batches, each wait for one timed on the host.

        With ``step`` it splits the loop's time into waiting for data and the step, with no synchronization added
        (:meth:`summary`); a loop that is data-bound for a sustained stretch gets one WARNING that says what to
        try. At the end of each pass the summary is kept for this family on this machine (``--explain`` shows it).
        Each batch is also the one ``step`` keeps for a replay, unless it is given another.
        """
        asked = time.perf_counter()
        batches = iter(loader)  # a DataLoader starts its workers here: waiting for data too
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    self._wait_ms += (time.perf_counter() - asked) * 1000
                    return
                got = time.perf_counter()
                self._data_batch = batch
                yield batch
                self._data_batch = None
                done = time.perf_counter()
                self._batch_done((got - asked) * 1000, (done - got) * 1000)
                asked = done
        finally:
            self._data_batch = None
            self._keep_summary()

    def summary(self) -> LoopSummary:
        """What this run saw of its loop so far: steps, the share of the loop's time spent waiting for data, data ms
        and step ms per batch, beside the step time calibration measured for this config."""
        timed = self._batches > 0 and self._wait_ms + self._step_ms > 0
        return LoopSummary(
            model_kind=self.model_kind, candidate=self.candidate, steps=self.steps, batches=self._batches,
            data_wait_share=self._wait_ms / (self._wait_ms + self._step_ms) if timed else None,
            data_ms=self._wait_ms / self._batches if timed else None,
            step_ms=self._step_ms / self._batches if timed else None,
            measured_step_ms=self.measured_step_ms, started_at=self.started_at,
            at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), autotune_version=__version__,
        )

    def fallback(self, *, prefer: Prefer = "auto", expected_steps: int | None = None) -> Answered:
        """What ``best_config`` answers now for this guard's model, at once (never measuring): after a demotion, the
        best remaining candidate, for an app that restarts from its last checkpoint. Pass the options
        ``best_config`` got.

        In a job it is a collective, as ``best_config`` is: every rank calls it (after the finding every rank's
        guard shares), so that every rank trains the one answer DDP needs; a rank that calls it alone raises
        :class:`RanksError` within ``AUTOTUNE_RANKS_LOOP_TIMEOUT_S``."""
        if self.answer is None:
            raise ConfigurationError("answer", None, "autotune.best_config", why=(
                "a Guard made by hand answers fallback() with the function it is given: pass "
                "answer=autotune.best_config, or make the guard with cfg.guard(), which gives it best_config"))
        if self.job is not None:
            # Every rank here first, within the loop's bound: the answer's own exchanges wait as long as a
            # calibration may take, which a rank that never calls would turn into that long a hang.
            self.job.allgather("", at="guard.fallback()", model_kind=self.model_kind, in_loop=True,
                               waiting_for="the other ranks to call guard.fallback() too (in a job every rank calls "
                               "it, as every rank calls best_config)")
        return self.answer(self.model_kind, model=self.model, prefer=prefer, expected_steps=expected_steps, wait=False)

    # -- reading and judging ---------------------------------------------------------------------------------

    def _read(self, *, timed: bool) -> None:
        assert self._buffer is not None
        losses, scales = self._buffer[:, :self._filled].tolist()
        now = time.perf_counter()
        if timed:
            self._last_step_ms = (now - self._read_at) * 1000 / self._filled
            if (now - self._read_at) * 1000 >= PACE_MIN_READ_MS:
                self._pace(self._last_step_ms)
        self._read_at = now
        first = self.steps - self._filled + 1
        self._filled = 0
        self._buffer[1].fill_(math.nan)
        found = None
        self._window_dropped = False
        for offset, (loss, scale) in enumerate(zip(losses, scales, strict=True)):
            step = first + offset
            found = self._judge_loss(step, loss) or (self._judge_scale(step, scale) if not math.isnan(scale) else None)
            if found is not None:
                break
        if self.job is not None:
            found = self._the_jobs(found)
        if found is not None:
            self._found(*found)
            return
        clean = all(math.isfinite(loss) for loss in losses) and not self._window_dropped
        if timed and clean and self._tape is not None and self._tape.due():
            self._tape.take(self.steps, self._scaler)  # a state to replay from: after steps that went well

    def _the_jobs(self, found: tuple[Misbehaviour, int, str, list[float]] | None
                  ) -> tuple[Misbehaviour, int, str, list[float]] | None:
        """The first rank's finding at this read, on every rank of the job (each rank reads at the same step)."""
        assert self.job is not None
        mine = _Seen(seen=found[0], step=found[1], detail=found[2], evidence=found[3]) if found is not None else None
        said = self.job.first(mine.model_dump_json() if mine is not None else None, in_loop=True,
                              at=f"the guard's read at step {self.steps:,}",
                              waiting_for=f"the other ranks' guard at step {self.steps:,}")
        if said is None:
            return None
        rank, text = said
        self._finder = rank
        seen = _Seen.model_validate_json(text)
        return seen.seen, seen.step, f"{seen.detail}, on rank {rank}", seen.evidence

    def _jobs_replay(self, seen: Misbehaviour, step: int) -> Replay:
        """The replay of the rank whose finding it is, on every rank of the job: only its batches showed it."""
        assert self.job is not None and self._finder is not None
        mine = self._replay(seen) if self.job.launch.rank == self._finder else None
        said = self.job.broadcast(mine.model_dump_json() if mine is not None else None, root=self._finder,
                                  in_loop=True, waiting_for=f"rank {self._finder}'s replay of step {step:,}")
        return Replay.model_validate_json(said)

    def _judge_loss(self, step: int, loss: float) -> tuple[Misbehaviour, int, str, list[float]] | None:
        if not math.isfinite(loss):
            steps = _within_window(self._non_finite, step, loss)
            if len(steps) < NON_FINITE_LOSSES:
                return None
            before = [self._last_finite] if self._last_finite is not None else []
            return ("non_finite", steps[0], f"{len(steps)} non-finite losses within {WINDOW_STEPS} steps (steps "
                    f"{', '.join(f'{s:,}' for s in steps)}; the last finite one {_number(before)})",
                    [*before, *(v for _, v in self._non_finite)])
        self._last_finite = loss
        if not self._block:
            self._block_start = step
        self._block.append(loss)
        if len(self._block) < BLOCK_STEPS:
            return None
        median, start = statistics.median(self._block), self._block_start
        self._block = []
        return self._judge_block(start, median)

    def _judge_block(self, start_step: int, median: float) -> tuple[Misbehaviour, int, str, list[float]] | None:
        self._medians.append(median)
        start, floor = self._medians[0], min(self._medians)
        progress = start - floor
        if progress <= MIN_PROGRESS * abs(start) or median <= floor + GIVE_BACK * progress:
            self._diverging = []
            return None
        self._diverging.append((start_step, median))
        if len(self._diverging) < DIVERGED_BLOCKS:
            return None
        first = self._diverging[0][0]
        last = start_step + BLOCK_STEPS - 1
        return ("diverged", first, f"the loss rose from its floor {floor:.4g} back to {median:.4g} (it started at "
                f"{start:.4g}), sustained over steps {first:,}-{last:,}",
                [start, floor, *(m for _, m in self._diverging)])

    def _judge_scale(self, step: int, scale: float) -> tuple[Misbehaviour, int, str, list[float]] | None:
        previous, self._scale = self._scale, scale
        if previous is None or scale >= previous:
            self._in_a_row = []
            self._clean_run += 1
            if self._clean_run >= SETTLED_STEPS:
                self._settled = True
            return None
        self._clean_run = 0
        self._window_dropped = True
        if not self._settled:
            self._backoff.append(scale)
            if len(self._backoff) <= BACKOFF_SKIPS:
                return None
            return ("skipped_steps", step - len(self._backoff) + 1, f"GradScaler's loss scale never settled: "
                    f"{len(self._backoff)} optimizer steps skipped from the start, the scale down to {scale:.3g}",
                    list(self._backoff))
        self._in_a_row.append(scale)
        if len(self._in_a_row) > BACKOFF_SKIPS:
            return ("skipped_steps", step - len(self._in_a_row) + 1, f"GradScaler skipped {len(self._in_a_row)} "
                    f"optimizer steps in a row and did not recover, the loss scale down to {scale:.3g}",
                    list(self._in_a_row))
        if len(self._in_a_row) > 1:
            return None  # the back-off under way: one, however many steps it skips
        steps = _within_window(self._skips, step, scale)
        if len(steps) < SKIPPED_STEPS:
            return None
        return ("skipped_steps", steps[0], f"GradScaler backed off {len(steps)} times within {WINDOW_STEPS} steps "
                f"(from steps {', '.join(f'{s:,}' for s in steps)}), the loss scale down to {scale:.3g}",
                [s for _, s in self._skips])

    def _found(self, seen: Misbehaviour, step: int, detail: str, evidence: list[float]) -> None:
        reference = is_reference(self.candidate)
        replay = None if reference else self._replay(seen) if self.job is None else self._jobs_replay(seen, step)
        signature = model_signature(self.model) if self.model is not None else None
        self.finding = Demotion(
            model_kind=self.model_kind, candidate=self.candidate, seen=seen, step=step, detail=detail,
            evidence=evidence, at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            autotune_version=__version__, model=signature, replay=replay,
            family_model=signature is not None and signature == family_model(self.model_kind),
        )
        demoted = replay is not None and replay.blame == "configuration"
        if demoted and (self.job is None or self.job.leads):  # in a job, once per machine
            _demotions.record(self.digest, self.finding)
        if self.job is not None:
            self.job.forget(self.model_kind)  # every rank asks again, together
        error = ConfigMisbehaved(self.model_kind, self.candidate.label, step, detail, demoted=demoted,
                                 why=replay_words(replay, self.candidate) if replay is not None else None)
        log.info("%s", error)  # the warning says it once; the log keeps it for a log file
        if self.on_failure == "raise":
            raise error
        warnings.warn(error, stacklevel=4)  # the caller of step() or check()

    def _replay(self, seen: Misbehaviour) -> Replay:
        if self._tape is None:
            return Replay(blame="unreplayed", detail=(
                "the guard was made without the model, its optimizer and a loss function, so it cannot replay the "
                "steps in fp32 (cfg.guard(model, optimizer, loss_fn=...))"))
        # In a job the other ranks wait for this replay: it stops well within their wait.
        limit_s = (REPLAY_JOB_SHARE * self.job.loop_timeout_s if self.job is not None and self.job.loop_timeout_s > 0
                   else None)
        return self._tape.replay(self.candidate, seen, self.steps, limit_s=limit_s,
                                 step_ms=self._last_step_ms or self.measured_step_ms)

    def _batch_done(self, wait_ms: float, step_ms: float) -> None:
        """Count one batch's wait and step; judge each window of ``read_every`` batches long enough to time."""
        self._batches += 1
        self._wait_ms += wait_ms
        self._step_ms += step_ms
        self._window_wait_ms += wait_ms
        self._window_ms += wait_ms + step_ms
        self._window_batches += 1
        if self._window_batches < self.read_every:
            return
        wait, loop_ms = self._window_wait_ms, self._window_ms
        self._window_wait_ms = self._window_ms = 0.0
        self._window_batches = 0
        if loop_ms < PACE_MIN_READ_MS:
            return
        share = wait / loop_ms
        self._waiting_windows = self._waiting_windows + 1 if share > DATA_WAIT_SHARE else 0
        if self._waiting_windows >= DATA_WAIT_WINDOWS and not self._warned_data:
            self._warned_data = True
            log.warning("%s on %s: %s", self.model_kind, self.candidate.label,
                        data_bound_words(share, DATA_WAIT_WINDOWS * self.read_every, self.speedup))

    def _keep_summary(self) -> None:
        """Keep what this run saw of its loop for its family, once it saw a window of batches; in a job, what its
        machine's first rank saw (one run, one entry)."""
        if self._batches >= self.read_every and (self.job is None or self.job.leads):
            _loops.record(self.digest, self.summary())

    def _pace(self, step_ms: float) -> None:
        """Watch this read's ms per step against the run's fastest; the first read (warm-up) sets no pace."""
        if self.steps <= self.read_every:
            return
        self._fastest_ms = min(self._fastest_ms, step_ms)
        self._slow_reads = self._slow_reads + 1 if step_ms > SLOW_FACTOR * self._fastest_ms else 0
        if self._slow_reads >= SLOW_BLOCKS and not self._warned_slow:
            self._warned_slow = True
            log.warning("%s on %s: the last %d steps took %.3g ms each, %.1fx this run's fastest (%.3g ms): another "
                        "workload or a throttled machine? `python -m autotune --check` re-times the pick",
                        self.model_kind, self.candidate.label, SLOW_BLOCKS * self.read_every, step_ms,
                        step_ms / self._fastest_ms, self._fastest_ms)


class _Seen(Record):
    """A rank's finding at one read, as it crosses to the other ranks of its job."""

    seen: Misbehaviour
    step: int
    detail: str
    evidence: list[float]


def _number(values: list[float]) -> str:
    return f"{values[0]:.4g}" if values else "none"


__all__ = [
    "BACKOFF_SKIPS", "BLOCK_STEPS", "DATA_WAIT_SHARE", "DATA_WAIT_WINDOWS", "DIVERGED_BLOCKS", "GIVE_BACK",
    "MIN_PROGRESS", "NON_FINITE_LOSSES",
    "PACE_MIN_READ_MS", "READ_EVERY_STEPS", "REPLAY_JOB_SHARE", "SETTLED_STEPS", "SKIPPED_STEPS", "SLOW_BLOCKS",
    "SLOW_FACTOR",
    "WINDOW_STEPS", "Guard", "OnFailure", "family_model", "is_reference", "model_signature",
]
