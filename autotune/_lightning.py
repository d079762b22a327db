"""The guard as a Lightning callback: ``Trainer(callbacks=[autotune.GuardCallback(cfg)])``. Importing it imports
Lightning; nothing else in autotune does."""

from __future__ import annotations

from typing import Any

import lightning

from autotune._config import Config
from autotune._guard import Guard, OnFailure


class GuardCallback(lightning.Callback):
    """Runs ``cfg.guard()`` over a Lightning fit: each training batch's loss (and the precision plugin's GradScaler,
    with ``16-mixed``) once the optimizer has stepped, and a last read when training ends. ``callback.guard`` is the
    guard (its ``finding``, its ``fallback()``)."""

    def __init__(self, config: Config, *, on_failure: OnFailure = "warn") -> None:
        self.guard: Guard = config.guard(on_failure=on_failure)

    def on_train_batch_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.guard.step(loss, getattr(trainer.precision_plugin, "scaler", None))

    def on_train_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        self.guard.check()


__all__ = ["GuardCallback"]
