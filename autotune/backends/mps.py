"""Apple Metal (``mps``): the GPU behind "GPU" on every Apple Silicon Mac."""

from __future__ import annotations

import os
import platform
import sys

import torch

from autotune._records import Precision
from autotune.backends.api import Accelerator, Backend, Finding, StepClock
from autotune.backends.cpu import cpu_brand

FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"


class MpsBackend(Backend):
    """Apple's GPU. torch.mps has no peak-memory counter, so this backend keeps one (see ``synchronize``)."""

    name = "mps"
    title = "Apple Metal (MPS)"
    device_type = "mps"
    asynchronous = True
    lightning_accelerator = "mps"
    lightning_one_process = True

    def __init__(self) -> None:
        #: the largest driver allocation seen since ``reset_peak_memory``, and the one at the reset; None before
        #: the first reset
        self._peak_bytes: int | None = None
        self._live_bytes: int | None = None

    def host_accelerators(self) -> list[Accelerator]:
        if sys.platform != "darwin" or not torch.backends.mps.is_built():
            return []
        if not torch.backends.mps.is_available():
            return []
        # The fallback variable makes unsupported ops run (and be timed) on the CPU, so it changes speed.
        fallback = " (CPU fallback on)" if os.environ.get(FALLBACK_VAR) == "1" else ""
        return [Accelerator(backend="mps", name=cpu_brand() + fallback, driver=f"macOS {platform.mac_ver()[0]}")]

    def unusable_reason(self) -> str | None:
        if sys.platform != "darwin":
            return "Apple Metal exists only on macOS"
        if not torch.backends.mps.is_built():
            return "this torch build has no MPS support"
        if not torch.backends.mps.is_available():
            return (f"MPS is built but not available on macOS {platform.mac_ver()[0]} "
                    "(needs 12.3+ and Apple Silicon or AMD GPU)")
        return None

    def devices(self) -> list[str]:
        return ["mps"]

    def precisions(self, device: str) -> list[Precision]:
        # bf16 on MPS needs macOS 14+; M1/M2 emulate it (slow), which the measurement will show.
        macos_major = int((platform.mac_ver()[0] or "0").split(".")[0])
        found: list[Precision] = ["fp32", "fp16-mixed"]
        if macos_major >= 14:
            found.append("bf16-mixed")
        return found

    def device_name(self, device: str) -> str:
        return f"Apple Metal ({cpu_brand()}, macOS {platform.mac_ver()[0]})"

    def synchronize(self, device: str) -> None:
        torch.mps.synchronize()
        # Every measured step ends here. The driver allocation keeps the allocator's cached buffers, so after a
        # step it still holds that step's activations: its maximum over the steps is the peak they needed.
        self._track_peak()

    def _track_peak(self) -> None:
        now = int(torch.mps.driver_allocated_memory())
        self._peak_bytes = now if self._peak_bytes is None else max(self._peak_bytes, now)

    def step_clock(self, device: str) -> StepClock | None:
        return StepClock(lambda: torch.mps.event.Event(enable_timing=True), lambda event: event.record())

    def release_cached_memory(self, device: str) -> None:
        torch.mps.empty_cache()

    def reset_peak_memory(self, device: str) -> None:
        torch.mps.empty_cache()
        self._peak_bytes = None
        self._track_peak()
        self._live_bytes = self._peak_bytes

    def peak_memory_bytes(self, device: str) -> int | None:
        """The largest driver allocation over the steps since the last reset, over the one at the reset
        (``driver_allocated_memory`` is the current one)."""
        self._track_peak()
        return None if self._peak_bytes is None else self._peak_bytes - (self._live_bytes or 0)

    def free_memory_bytes(self, device: str) -> int | None:
        """Metal's recommended working set less what the driver holds now: unified memory is shared with the
        CPU, and going beyond the recommendation pages to disk or fails."""
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        if recommended is None:
            return None
        return max(0, int(recommended()) - int(torch.mps.driver_allocated_memory()))

    def diagnose(self) -> list[Finding]:
        findings = []
        if sys.platform == "darwin" and platform.machine() == "arm64":
            if not torch.backends.mps.is_built():
                findings.append(Finding(level="error", message=f"Apple Silicon, but torch {torch.__version__} was "
                                        "built without MPS", fix="install the standard macOS arm64 torch wheel"))
            elif not torch.backends.mps.is_available():
                findings.append(Finding(
                    level="error", message="Apple Silicon, MPS built but not available",
                    fix="update macOS to 12.3 or later and use a native arm64 Python (not Rosetta)"))
        if os.environ.get(FALLBACK_VAR) == "1":
            findings.append(Finding(
                level="warning",
                message=f"{FALLBACK_VAR}=1: ops MPS lacks run on the CPU, and calibration would time them as GPU work",
                fix=f"unset {FALLBACK_VAR} before calibrating, or accept that MPS timings include CPU fallbacks",
            ))
        return findings

    def is_oom(self, exc: BaseException) -> bool:
        return super().is_oom(exc) or "MPS backend out of memory" in str(exc)
