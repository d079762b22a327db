"""The guard's replay: whether a misbehaviour the guard found is the configuration's doing or the training's.

The guard keeps a state to replay from (the model's, the optimizer's and GradScaler's, copied to the host when it
starts and at clean reads, each copy once the run has trained ``1 / SNAPSHOT_SHARE`` times as long as the last
took) and the batches ``guard.step`` was given since (at most ``REPLAY_STEPS``, ``REPLAY_BYTES`` in all: the
latest). On a finding, copies restart from that state and train on those batches, in the reference precision (fp32
on the run's device; on the CPU for a GPU's own fp32), then in the run's; the run's model, optimizer, GradScaler,
fp32 settings and random state are left as they were. Its cost: the copies to the host (at most ``SNAPSHOT_SHARE``
of the run's time), one state in host memory (none over ``SNAPSHOT_MEMORY_SHARE`` of the available memory), and at
a finding twice the replayed steps, stopped at ``REPLAY_STEP_TIMES`` times the run's step time per step.

The guard follows the run's optimizer (each step's hyperparameters, a scheduler's included), how many backward
passes each step follows and whether the gradients change before the step. A loop the replay cannot reproduce
(accumulated, clipped or averaged gradients) is said in the finding, and only evidence that is the configuration's
alone demotes: the run's precision judged batch by batch on the reference's weights, a non-finite loss or gradient
where fp32's are finite. A divergence is replayed at the learning rate of the finding and not judged so.

The replay trains on the finding rank alone and joins no collective: it copies the module inside DDP, DataParallel
and ``torch.compile``'s wrappers, its SyncBatchNorm layers normalize over the local batch; a sharded model (FSDP,
ZeroRedundancyOptimizer) has no whole state on one rank: the guard says so once and its findings demote nothing.
"""
from __future__ import annotations

import copy
import logging
import math
import statistics
import sys
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune import _batch
from autotune._apply import fp32 as _fp32
from autotune._apply import precision as _precision
from autotune._records import FP32_CPU, Candidate, Misbehaviour, Replay
from autotune._variants import CPU, FP32
from autotune.backends import backend_for

log = logging.getLogger("autotune")

LossFn = Callable[[nn.Module, Any], torch.Tensor]

#: the most of the run's time the copies to the host may take, after the first one
SNAPSHOT_SHARE = 0.005
#: the most batches kept for a replay (the latest): a small model's state copies are rare against its short steps
REPLAY_STEPS = 1000
#: the most bytes of batches kept for a replay: fewer, larger batches are kept
REPLAY_BYTES = 128 * 2**20
#: the most of the host's available memory the snapshots of one machine's ranks may hold together
SNAPSHOT_MEMORY_SHARE = 0.25
#: a replay stops after this many times the run's step time per replayed step (both passes together): a reference
#: a few times slower than the run's precision fits, a reference on the CPU for a GPU's fp32 may not
REPLAY_STEP_TIMES = 25.0
#: a replay may always take this long: at the scale of tiny steps, copying the model and the timer are the noise
REPLAY_MIN_S = 10.0
#: a replay diverges where the median of its second half of losses is this many times that of its first half
DIVERGED_RISE = 1.5


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _batch.tensors(value))


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(CPU, copy=True)


@dataclass(frozen=True)
class Snapshot:
    """The run's state after ``step`` steps, on the host."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any] | None
    took_s: float


@dataclass(frozen=True)
class _Seen:
    """One replayed step: its loss, and whether its gradients were finite and its optimizer step skipped."""

    loss: float
    finite_grads: bool
    skipped: bool


def unwrapped(model: nn.Module) -> nn.Module:
    """The module inside ``torch.compile``'s, DataParallel's and DistributedDataParallel's wrappers: the one whose
    copy trains alone (a DDP module's copy would join the job's gradient all-reduce on this rank only)."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _sharded(model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why this rank holds no whole state to replay from (FSDP, ZeroRedundancyOptimizer), or None. Only what the app
    imported can be in use: nothing is imported here."""
    zero = getattr(sys.modules.get("torch.distributed.optim"), "ZeroRedundancyOptimizer", None)
    if zero is not None and isinstance(optimizer, zero):
        return "the optimizer is a ZeroRedundancyOptimizer: its state is spread over the ranks, none can replay alone"
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kinds = tuple(k for k in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None))
                  if isinstance(k, type))
    sharded = next((m for m in model.modules() if isinstance(m, kinds)), None) if kinds else None
    if sharded is not None:
        return f"the model is sharded across the ranks ({type(sharded).__name__}): none can replay alone"
    return None


class _Loop:
    """What the run's loop does that a replay must do alike, from torch's hooks on its optimizer's step and on one
    parameter's accumulated gradient (one parameter: the hook runs at every backward pass): the hyperparameters of
    the last optimizer step, and the counts behind :meth:`unlike`. The hooks hold the tape weakly and go with it."""

    def __init__(self, tape: Tape, parameter: nn.Parameter) -> None:
        self.parameter = parameter
        #: each param group's hyperparameters at the last optimizer step (None: no step seen yet)
        self.hyper: list[dict[str, Any]] | None = None
        self._passes = 0  # backward passes that reached the parameter since the last optimizer step
        self._grad: tuple[torch.Tensor, int] | None = None  # its gradient after the last pass, and its version
        self.single = 0  # optimizer steps after one backward pass
        self.accumulated: list[int] = []  # the passes of each optimizer step after more than one
        self.changed = 0  # optimizer steps whose gradient was changed in place after the backward pass
        owner = weakref.ref(tape)

        def passed(param: torch.Tensor) -> None:
            if (tape := owner()) is not None and tape.loop is not None and param is tape.loop.parameter:
                tape.loop._passed(param)

        def stepping(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if (tape := owner()) is not None and tape.loop is not None and optimizer is tape.optimizer:
                tape.loop._stepping(optimizer)

        handles = (parameter.register_post_accumulate_grad_hook(passed),
                   tape.optimizer.register_step_pre_hook(stepping))
        weakref.finalize(tape, lambda: [handle.remove() for handle in handles])

    def _passed(self, param: torch.Tensor) -> None:
        self._passes += 1
        self._grad = (param.grad, param.grad._version) if param.grad is not None else None

    def _stepping(self, optimizer: torch.optim.Optimizer) -> None:
        self.hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        if self._passes == 0:  # the parameter took no part in this step
            return
        if self._passes == 1:
            self.single += 1
        else:
            self.accumulated.append(self._passes)
        # An in-place change bumps the tensor's version counter (autograd's own check of saved tensors); GradScaler's
        # unscale does not (its kernel writes without it), clip_grad_norm_'s multiply and DDP's average do.
        grad = self.parameter.grad
        if grad is not None and self._grad is not None and (grad is not self._grad[0]
                                                            or grad._version != self._grad[1]):
            self.changed += 1
        self._passes = 0
        self._grad = None

    def unlike(self) -> str | None:
        """What the replay, one optimizer step per batch on the gradients of its backward pass, cannot reproduce of
        this loop, in words; None where it can. Accumulation is most steps following several backward passes (a
        step GradScaler skipped leaves two before the next)."""
        said = []
        if self.changed:
            said.append("changes the gradients between the backward pass and the optimizer's step (clipping, or "
                        "DistributedDataParallel's average over the ranks)")
        if len(self.accumulated) > self.single:
            said.append(f"accumulates gradients over {statistics.median_low(self.accumulated)} backward passes per "
                        "optimizer step")
        return f"the loop {' and '.join(said)}" if said else None


class _LocalBatchNorm(nn.SyncBatchNorm):
    """A replayed copy's SyncBatchNorm: batch norm over the local batch, as BatchNorm does (no collective)."""

    forward = nn.modules.batchnorm._BatchNorm.forward


class Tape:
    """What a guard keeps to replay: the model (inside its wrappers), optimizer and loss function it was given, the
    last state on the host and the batches since. ``cannot``: why it keeps nothing (said once, when it is known)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
                 ranks: int = 1) -> None:
        self.model = unwrapped(model)
        #: the ranks on this machine, whose snapshots share its memory
        self.ranks = ranks
        self.optimizer = _torch_optimizer(optimizer)
        self.loss_fn = loss_fn
        self.cannot = _sharded(self.model, self.optimizer)
        if self.cannot is not None:
            self._say_cannot()
        watched = next((p for p in self.model.parameters() if p.requires_grad), None)
        #: what the run's loop does that the replay must do alike (None: nothing to watch)
        self.loop = _Loop(self, watched) if self.cannot is None and watched is not None else None
        self.snapshot: Snapshot | None = None
        #: the snapshots taken so far
        self.taken = 0
        self.batches: deque[Any] = deque(maxlen=REPLAY_STEPS)
        self._sized = False
        self._taken_at = 0.0

    def add(self, batch: Any, step: int, scaler: torch.amp.GradScaler | None) -> None:
        """Keep ``batch``, the inputs of ``step`` (the first one also takes the first snapshot, after it)."""
        if self.cannot is not None:
            return
        if self.snapshot is None:
            self.take(step, scaler)  # the state this batch trained from is gone: the one it made
            return
        if not self._sized:  # from the first batch's size: batches of one run are alike
            self._sized = True
            self.batches = deque(maxlen=max(1, min(REPLAY_STEPS, REPLAY_BYTES // max(1, _bytes(batch)))))
        self.batches.append((batch, self.loop.hyper if self.loop is not None else None))

    def due(self) -> bool:
        """Whether a new snapshot fits in ``SNAPSHOT_SHARE`` of the time since the last one."""
        return self.snapshot is not None and (
            time.perf_counter() - self._taken_at) * SNAPSHOT_SHARE >= self.snapshot.took_s

    def take(self, step: int, scaler: torch.amp.GradScaler | None) -> None:
        """Copy the model's, the optimizer's and the scaler's state to the host, as of ``step`` steps; forget the
        batches before it. A state that cannot be copied is said once, and nothing is kept from then on."""
        started = time.perf_counter()
        self.snapshot = None  # released before the next is built: one copy in host memory at a time
        self.batches.clear()
        try:
            state = self.model.state_dict()
            optimizer_state = self.optimizer.state_dict()
            self.cannot = self._too_large(_bytes(state) + _bytes(optimizer_state))
            if self.cannot is not None:
                self._say_cannot()
                return
            model = {name: _on_host(t) for name, t in state.items()}
            optimizer = _batch.map_tensors(optimizer_state, _on_host)
            kept = copy.deepcopy(scaler.state_dict()) if scaler is not None and scaler.is_enabled() else None
        except Exception as exc:  # the app's modules and optimizer say what their state is: a failure is theirs
            self.cannot = f"its state could not be copied to the host ({type(exc).__name__}: {exc})"[:300]
            self._say_cannot()
            return
        self._taken_at = time.perf_counter()
        self.snapshot = Snapshot(step=step, model=model, optimizer=optimizer, scaler=kept,
                                 took_s=self._taken_at - started)
        self.taken += 1

    def _too_large(self, size: int) -> str | None:
        """Why a state of ``size`` bytes is not kept on the host (over its share of the available memory), or None;
        None too where the OS does not say what is available."""
        available = backend_for(CPU).free_memory_bytes(CPU)
        if available is None or size <= SNAPSHOT_MEMORY_SHARE * available / self.ranks:
            return None
        shared = f", shared by this machine's {self.ranks} ranks" if self.ranks > 1 else ""
        return (f"the model's and optimizer's state ({size / 2**20:,.3g} MiB) is more than {SNAPSHOT_MEMORY_SHARE:.0%} "
                f"of the host memory available ({available / 2**20:,.3g} MiB{shared})")

    def replay(self, candidate: Candidate, seen: Misbehaviour, steps: int, *, step_ms: float | None,
               limit_s: float | None = None) -> Replay:
        """Train copies from the snapshot on the kept batches, in the reference and in ``candidate``'s precision;
        the blame. ``steps``: the steps the run has trained; ``step_ms``: the run's time per step (None: not known),
        of which the replay may take ``REPLAY_STEP_TIMES`` per replayed step; ``limit_s``: at most this long in any
        case (a job's ranks wait for it). Where the loop is one the replay cannot reproduce (:meth:`_Loop.unlike`),
        ``candidate`` is judged on the reference's own weights instead of training a path of its own."""
        if self.cannot is not None:
            return Replay(blame="unreplayed", detail=self.cannot)
        if self.snapshot is None or not self.batches:
            return Replay(blame="unreplayed", detail="guard.step was given no batch to replay (batch=...)")
        snapshot = self.snapshot
        batches = list(self.batches)
        reference = reference_for(candidate)
        unlike = self.loop.unlike() if self.loop is not None else None
        found = Replay(blame="not_reproduced", detail="", from_step=snapshot.step, steps=len(batches),
                       since=steps - snapshot.step, reference=reference)
        if unlike is not None:
            if reference.device != candidate.device:
                return found.model_copy(update={"blame": "unreplayed", "detail": (
                    f"{unlike}, which the replay does not, and its reference runs on {reference.device}, not beside "
                    f"{candidate.label}: nothing it could see would be the configuration's alone")})
            found = found.model_copy(update={"detail": (
                f"{unlike}, which the replay does not: {candidate.precision} was judged on fp32's own weights, batch "
                "by batch")})
        per_step = max(REPLAY_MIN_S, REPLAY_STEP_TIMES * step_ms / 1000 * len(batches)) if step_ms else None
        limit = min((s for s in (limit_s, per_step) if s is not None), default=math.inf)
        deadline = time.perf_counter() + limit
        try:
            on_reference, beside = self._run(snapshot, batches, reference, with_scaler=False, deadline=deadline,
                                             follow=seen != "diverged",
                                             judging=(candidate, seen) if unlike is not None else None)
            if (reference_at := _misbehaves(seen, on_reference)) is not None:
                return found.model_copy(update={"blame": "training", "reference_at": reference_at})
            if unlike is not None:  # a divergence of its own is not judged: it would follow another loop's path
                run_at = _misbehaves("non_finite" if seen == "diverged" else seen, beside)
                return found.model_copy(update={"blame": "configuration" if run_at is not None else "not_reproduced",
                                                "run_at": run_at})
            on_run, _ = self._run(snapshot, batches, candidate, with_scaler=True, deadline=deadline,
                                  follow=seen != "diverged")
        except _OutOfTime as late:
            why = "below the wait of the job's other ranks" if limit == limit_s else \
                f"{REPLAY_STEP_TIMES:g} times the run's step time per replayed step"
            return found.model_copy(update={"blame": "unreplayed", "detail": (
                f"the replay stopped at its time limit, {limit:.3g} s ({why}), in {late.on.label} at replayed step "
                f"{late.at} of {len(batches)}")})
        except Exception as exc:  # the app's model and loss run here: whatever fails, it is said
            return found.model_copy(update={"blame": "unreplayed", "detail": (
                f"the replay failed: {type(exc).__name__}: {exc}")[:300]})
        run_at = _misbehaves(seen, on_run)
        if seen == "diverged" and len(batches) < steps - snapshot.step:
            run_at = None  # a divergence follows the run's path: from the state, some of its batches are gone
        return found.model_copy(update={"blame": "configuration" if run_at is not None else "not_reproduced",
                                        "run_at": run_at})

    def _run(self, snapshot: Snapshot, batches: list[tuple[Any, list[dict[str, Any]] | None]], on: Candidate, *,
             with_scaler: bool, deadline: float, follow: bool, judging: tuple[Candidate, Misbehaviour] | None = None
             ) -> tuple[list[_Seen], list[_Seen]]:
        """Copies of the model and optimizer from ``snapshot`` trained on ``batches`` as ``on`` says, at the run's
        hyperparameters now or, with ``follow``, each step at those the run's optimizer stepped with; each step
        seen. With ``judging``, that candidate's precision is also seen on each step's weights and batch before the
        step (its gradients too, for skipped steps, at the snapshot's loss scale). Stops at the first non-finite loss
        or gradient; raises :class:`_OutOfTime` past ``deadline``."""
        device = torch.device(on.device)
        with warnings.catch_warnings():  # what the app's model says when trained again was said in the run
            warnings.simplefilter("ignore")
            model, optimizer = copy.deepcopy((self.model, self.optimizer))
            for module in model.modules():
                if isinstance(module, nn.SyncBatchNorm):
                    module.__class__ = _LocalBatchNorm
            # A learning-rate scheduler (or Accelerate) patches ``step`` on the instance, bound to the run's optimizer
            # through a weak reference: the copy steps through its class.
            optimizer.__dict__.pop("step", None)
            model.to(device)
            model.load_state_dict(snapshot.model)
            optimizer.load_state_dict(snapshot.optimizer)
            for replayed, now in zip(optimizer.param_groups, self.optimizer.param_groups, strict=True):
                replayed.update({k: v for k, v in now.items() if k != "params"})  # the finding's learning rate
            scaler = None
            if with_scaler and snapshot.scaler is not None:
                scaler = torch.amp.GradScaler(device.type)
                scaler.load_state_dict(snapshot.scaler)
            dtype = _precision.AUTOCAST_DTYPES[on.precision]
            seen: list[_Seen] = []
            beside: list[_Seen] = []
            forked = [device.index or 0] if backend_for(on.device).forks_rng else []
            with _fp32.preserved(), torch.random.fork_rng(devices=forked):
                if dtype is None:
                    _fp32.apply(on.precision)
                for batch, hyper in batches:
                    for replayed, then in zip(optimizer.param_groups, hyper if follow and hyper else [], strict=False):
                        replayed.update(then)
                    moved = _batch.map_tensors(batch, lambda t: t.to(device))  # the reference may run on the CPU
                    if judging is not None:
                        beside.append(self._judged(model, moved, device, *judging,
                                                   scale=(snapshot.scaler or {}).get("scale", 1.0)))
                    with _precision.autocast(device.type, on.precision):
                        loss = self.loss_fn(model, moved)
                    optimizer.zero_grad(set_to_none=True)
                    value = float(loss.detach().float().sum())
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                    finite = _finite_grads(model)
                    skipped = False
                    if scaler is not None:
                        before = scaler.get_scale()
                        scaler.step(optimizer)
                        scaler.update()
                        skipped = scaler.get_scale() < before
                    else:
                        optimizer.step()
                    seen.append(_Seen(value, finite, skipped))
                    if not math.isfinite(value) or not (finite or scaler is not None):
                        break
                    if time.perf_counter() > deadline:
                        raise _OutOfTime(on, len(seen))
            return seen, beside

    def _judged(self, model: nn.Module, batch: Any, device: torch.device, candidate: Candidate, seen: Misbehaviour,
                *, scale: float) -> _Seen:
        """``candidate``'s precision on ``model``'s weights and ``batch`` as they are: its loss, and for skipped steps
        whether its gradients at the loss ``scale`` are finite (left cleared)."""
        with _precision.autocast(device.type, candidate.precision), \
                torch.set_grad_enabled(seen == "skipped_steps"):
            loss = self.loss_fn(model, batch)
        value = float(loss.detach().float().sum())
        if seen != "skipped_steps":
            return _Seen(value, True, False)
        model.zero_grad(set_to_none=True)
        (loss * scale).backward()
        finite = _finite_grads(model)
        model.zero_grad(set_to_none=True)
        return _Seen(value, finite, False)

    def _say_cannot(self) -> None:
        log.warning("the guard keeps no state to replay from, so its findings demote nothing: %s", self.cannot)


class _OutOfTime(Exception):
    """A replay past its time limit: in ``on``, after replayed step ``at``."""

    def __init__(self, on: Candidate, at: int) -> None:
        super().__init__(on, at)
        self.on = on
        self.at = at


def _finite_grads(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]).isfinite().all()) if grads else True


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrapper (Accelerate's ``.optimizer``, Lightning's ``._optimizer``)."""
    inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
    while isinstance(inner, torch.optim.Optimizer):
        optimizer, inner = inner, getattr(inner, "optimizer", None) or getattr(inner, "_optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return optimizer


def reference_for(candidate: Candidate) -> Candidate:
    """fp32 on ``candidate``'s device; on the CPU where the candidate is a GPU's own fp32."""
    device = candidate.device if candidate.precision != FP32.name else FP32_CPU.device
    return Candidate(device=device, precision=FP32.name)


def _diverges(seen: list[_Seen]) -> bool:
    """Whether the median of the second half of the losses is ``DIVERGED_RISE`` times that of the first half."""
    losses = [s.loss for s in seen]
    half = len(losses) // 2
    return half > 0 and statistics.median(losses[half:]) >= DIVERGED_RISE * statistics.median(losses[:half]) > 0


def _misbehaves(seen: Misbehaviour, steps: list[_Seen]) -> int | None:
    """The replayed step (from 1) at which ``steps`` misbehave as the run did (``seen``), or None.

    - non-finite losses: a non-finite loss;
    - skipped steps: a non-finite loss, non-finite gradients, or a step GradScaler skipped;
    - a diverging loss: a non-finite loss, or losses that diverge (:func:`_diverges`; the last step).
    """
    for index, step in enumerate(steps, 1):
        if not math.isfinite(step.loss):
            return index
        if seen == "skipped_steps" and (step.skipped or not step.finite_grads):
            return index
    return len(steps) if seen == "diverged" and _diverges(steps) else None


__all__ = ["DIVERGED_RISE", "REPLAY_BYTES", "REPLAY_MIN_S", "REPLAY_STEPS", "REPLAY_STEP_TIMES",
           "SNAPSHOT_MEMORY_SHARE", "SNAPSHOT_SHARE", "LossFn", "Snapshot", "Tape", "reference_for", "unwrapped"]
