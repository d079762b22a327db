"""The guard as a Lightning callback: ``Trainer(callbacks=[autotune.GuardCallback(cfg)])``, for the ``lightning``
package and the older ``pytorch_lightning`` alike. Importing it imports whichever of them is installed (both where
both are, so that either's Trainer takes the callback); nothing else in autotune imports Lightning."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from autotune._decision import Decision
from autotune._errors import FrameworkError
from autotune._frameworks.lightning import PACKAGES
from autotune._guard.watch import Guard, OnFailure
from autotune._ranks.group import joined
from autotune._ranks.job import confirm


def _callback_base() -> type:
    """``Callback`` of each Lightning package installed, as one base class; ImportError saying what to install."""
    bases = []
    for name in PACKAGES:
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    if not bases:
        raise ImportError("autotune.GuardCallback needs Lightning: pip install lightning (or pytorch-lightning); "
                          "in a loop of your own, call guard.step(loss, scaler, batch=batch) from cfg.guard(...)")
    return bases[0] if len(bases) == 1 else type("Callback", tuple(bases), {})


if TYPE_CHECKING:
    from lightning import Callback as _Base
else:
    _Base = _callback_base()


@runtime_checkable
class Guarded(Protocol):
    """A decision that makes its own guard: the Config ``best_config`` answered (read here without importing it)."""

    def guard(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, *,
              loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
              on_failure: OnFailure = "warn") -> Guard[Any]: ...


def _training_step_loss(module: nn.Module, batch_and_index: tuple[Any, int]) -> torch.Tensor:
    """The loss ``training_step`` returns (a tensor, or a dict's ``"loss"``), for the guard's replay."""
    batch, index = batch_and_index
    out = module.training_step(batch, index)  # type: ignore[operator]
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"training_step returned {type(out).__name__}, not a loss to replay")
    return loss


class GuardCallback(_Base):
    """Runs ``cfg.guard()`` over a Lightning fit: each training batch's loss (and the precision plugin's GradScaler,
    with ``16-mixed``) once the optimizer has stepped, and a last read when training ends. It watches the
    LightningModule and its optimizer, so a finding is replayed through ``training_step`` before anything is
    demoted. ``callback.guard`` is the guard (its ``finding``, its ``fallback()``). Automatic optimization only:
    with manual optimization it refuses to start (call ``guard.step`` in ``training_step`` instead).

    Under DDP a finding on one rank is the job's (every rank warns, one demotion per machine). A Config answered
    before Lightning's own launcher started the other processes (each answered alone) is compared across the ranks
    when the fit sets up: one that differs raises :class:`~autotune.RanksError` naming both answers."""

    def __init__(self, config: Decision, *, on_failure: OnFailure = "warn") -> None:
        if not isinstance(config, Guarded):
            raise TypeError(f"GuardCallback takes the Config best_config answered, got {type(config).__name__}")
        super().__init__()
        self.config = config
        self.on_failure = on_failure
        self.guard: Guard[Any] = config.guard(on_failure=on_failure)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.world_size > 1 and self.guard.job is None:
            job = joined(required=True)
            assert job is not None  # required: it raises instead
            confirm(job, self.config)
            self.guard = Guard(self.config.model_kind, self.config.candidate, self.config.fingerprint_digest,
                               on_failure=self.on_failure, step_ms=self.config.step_ms,
                               speedup=self.config.speedup_vs_fp32_cpu, job=job, answer=self.guard.answer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not pl_module.automatic_optimization:
            raise FrameworkError("Lightning", "guard", (
                "with manual optimization (automatic_optimization = False) the optimizer steps inside training_step, "
                "where GuardCallback cannot follow it; drop the callback and call guard.step(loss, scaler, "
                "batch=batch) in training_step after your optimizer step, with guard = cfg.guard(self, optimizer, "
                "loss_fn=...)"))
        if trainer.optimizers:
            self.guard.watch(pl_module, trainer.optimizers[0], _training_step_loss)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            self.guard.step(loss, getattr(trainer.precision_plugin, "scaler", None), batch=(batch, batch_idx))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.guard.check()


__all__ = ["GuardCallback"]
