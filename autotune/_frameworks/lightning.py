"""A decision in Lightning's words: the ``lightning.Trainer`` keywords (``Config.lightning_kwargs``) and the fp16
precision plugin, from the Lightning package the app imported. Imports no Lightning until a plugin is asked for."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch

from autotune._apply import precision as _precision
from autotune._decision import Decision
from autotune._errors import ConfigurationError, FrameworkError
from autotune._variants import CPU, FP16_MIXED, precision_row
from autotune.backends import backend_for

#: the Lightning packages, the newer first: the callback subclasses each one's ``Callback``, the plugin comes from the
#: one the app imported
PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def trainer_kwargs(decision: Decision, *, devices: int | None, init_scale: bool) -> dict[str, Any]:
    """``Config.lightning_kwargs``: keyword arguments for ``lightning.Trainer`` that train as ``decision`` was
    measured; :class:`FrameworkError` where Lightning would run something else (the Config's docstring says which)."""
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise ConfigurationError("devices", devices, "a positive int: the processes on this machine")
    device = torch.device(decision.device)
    backend = backend_for(decision.device)
    if backend.lightning_accelerator is None:
        raise FrameworkError("Lightning", f"device {decision.device!r}", (
            f"Lightning has no built-in accelerator for {backend.title}; train with cfg.prepare() and "
            "cfg.autocast() in your own loop, or through Accelerate (cfg.accelerate_kwargs())"))
    plugin = init_scale and decision.precision == FP16_MIXED.name
    if device.type == CPU and decision.precision == FP16_MIXED.name and not plugin:
        raise FrameworkError("Lightning", "fp16 mixed precision on the CPU", (
            "Lightning replaces precision='16-mixed' on the CPU with 'bf16-mixed'; pass "
            "**cfg.lightning_kwargs(init_scale=True), which gives its fp16 plugin instead, or train with "
            "cfg.autocast() in your own loop"))
    per_machine = devices if devices is not None else decision.ranks.local_world_size if decision.ranks else 1
    nodes = decision.ranks.nodes if decision.ranks is not None and devices is None else 1
    if per_machine == 1 and nodes == 1:
        placed: int | list[int] = [device.index] if device.index is not None else 1
        kwargs: dict[str, Any] = {"accelerator": backend.lightning_accelerator, "devices": placed}
    elif backend.lightning_one_process:
        raise FrameworkError("Lightning", f"{per_machine * nodes} processes on {device.type.upper()}", (
            f"Lightning trains on one {device.type.upper()} device, in one process; ask for devices=1"))
    else:
        kwargs = {"accelerator": backend.lightning_accelerator, "devices": per_machine,
                  **({"num_nodes": nodes} if nodes > 1 else {}), "strategy": "ddp"}
    if plugin:
        scaler = _precision.grad_scaler(decision.device_type, decision.precision, decision.init_scale)
        return {**kwargs, "plugins": [fp16_plugin(device.type, scaler)]}
    return {**kwargs, "precision": precision_row(decision.precision).lightning}


def fp16_plugin(device_type: str, scaler: torch.amp.GradScaler) -> Any:
    """Lightning's fp16 precision plugin with ``scaler``, from the Lightning package the app imported (``lightning``
    first, else ``pytorch_lightning``); ImportError saying what to install where neither is."""
    for name in [p for p in PACKAGES if p.split(".")[0] in sys.modules] or PACKAGES:
        try:
            precision = importlib.import_module(f"{name}.plugins.precision")
        except ImportError:
            continue
        return precision.MixedPrecision(FP16_MIXED.lightning, device_type, scaler=scaler)
    raise ImportError("lightning_kwargs(init_scale=True) needs Lightning: pip install lightning (or pytorch-lightning)")


__all__ = ["PACKAGES", "fp16_plugin", "trainer_kwargs"]
