"""The guard as a Lightning callback: ``Trainer(callbacks=[autotune.GuardCallback(cfg)])``. Importing it imports
Lightning; nothing else in autotune does."""

from __future__ import annotations

from typing import Any

import lightning

from autotune._config import Config
from autotune._guard import Guard, OnFailure
from autotune._ranks.group import joined
from autotune._ranks.job import confirm


class GuardCallback(lightning.Callback):
    """Runs ``cfg.guard()`` over a Lightning fit: each training batch's loss (and the precision plugin's GradScaler,
    with ``16-mixed``) once the optimizer has stepped, and a last read when training ends. ``callback.guard`` is the
    guard (its ``finding``, its ``fallback()``).

    Under DDP a finding on one rank is the job's (every rank warns, one demotion per machine). A Config answered
    before Lightning's own launcher started the other processes (each answered alone) is compared across the ranks
    when the fit sets up: one that differs raises :class:`~autotune.RanksError` naming both answers."""

    def __init__(self, config: Config, *, on_failure: OnFailure = "warn") -> None:
        self.config = config
        self.on_failure = on_failure
        self.guard: Guard = config.guard(on_failure=on_failure)

    def setup(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, stage: str) -> None:
        if trainer.world_size > 1 and self.guard.job is None:
            job = joined(required=True)
            assert job is not None  # required: it raises instead
            confirm(job, self.config)
            self.guard = Guard(self.config.model_kind, self.config.candidate, self.config.fingerprint_digest,
                               on_failure=self.on_failure, step_ms=self.config.step_ms,
                               speedup=self.config.speedup_vs_fp32_cpu, job=job)

    def on_train_batch_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.guard.step(loss, getattr(trainer.precision_plugin, "scaler", None))

    def on_train_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        self.guard.check()


__all__ = ["GuardCallback"]
