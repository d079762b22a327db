"""NVIDIA CUDA (and AMD ROCm, which torch exposes as ``cuda``).

bf16 is *proposed* on every card but only called native on compute capability >= 8 (Ampere) on NVIDIA, and
on the AMD architectures with bf16 matrix instructions (:data:`ROCM_NATIVE_BF16`; a ROCm "capability" is the
gcnArch, e.g. 9.0 for gfx90a and gfx906 alike, so its major says nothing about bf16):
``torch.cuda.is_bf16_supported()`` defaults to ``including_emulation=True`` and says True on cards before
Ampere too, which emulate bf16 far slower than fp32. The measurement, not that flag, decides.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from autotune._records import ClockEvent, Precision
from autotune.backends.api import Accelerator, Backend, ClockReading, Finding, StepClock

_PROC_DRIVER = "/proc/driver/nvidia"
#: where the amdgpu kernel driver describes each GPU (Linux), readable without initialising HIP
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
_AMDGPU_VERSION = "/sys/module/amdgpu/version"

#: AMD architectures with native bf16 matrix instructions: MI200 (gfx90a), MI300 (gfx94x), MI350 (gfx950),
#: RDNA3 (gfx11xx) and RDNA4 (gfx12xx). Older ones (gfx906, gfx908, gfx10xx) emulate or lack it.
ROCM_NATIVE_BF16 = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


#: NVML's clock-event (throttle) reason bits that slow a busy GPU down: the software power cap, hardware
#: slowdown (and its power brake), software and hardware thermal slowdown. Idle, the application's clock
#: setting, sync boost and display clocks say nothing about a candidate's speed.
NVML_CLOCK_EVENTS: dict[int, ClockEvent] = {
    0x04: "power_cap", 0x08: "hw_slowdown", 0x20: "thermal", 0x40: "thermal", 0x80: "hw_slowdown",
}
#: where to get the NVML bindings
NVML_HINT = "nvidia-ml-py is not installed (pip install 'torch-autotune-device[nvidia]')"


def clock_events(reasons: int) -> list[ClockEvent]:
    """The throttle reasons in an NVML clock-event bitmask, e.g. ``0x21 -> ['thermal']`` (0x1 is idle)."""
    return sorted({event for bit, event in NVML_CLOCK_EVENTS.items() if reasons & bit})


def gfx_arch(target_version: int) -> str:
    """The gfx name of a KFD ``gfx_target_version``, e.g. ``90010 -> 'gfx90a'``, ``110000 -> 'gfx1100'``."""
    major, minor, stepping = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor}{stepping:x}"


def rocm_native_bf16(arch: str) -> bool:
    """Whether a gcnArch name (``'gfx90a:sramecc+:xnack-'``) has native bf16 matrix instructions."""
    return arch.split(":", 1)[0].startswith(ROCM_NATIVE_BF16)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _node_index(path: str) -> int:
    name = os.path.basename(path)
    return int(name) if name.isdigit() else -1


def _properties(text: str) -> dict[str, str]:
    """A KFD ``properties`` file: one ``name value`` pair per line."""
    pairs = (line.split(None, 1) for line in text.splitlines())
    return {pair[0]: pair[1].strip() for pair in pairs if len(pair) == 2}


def amd_gpus(nodes_dir: str = _KFD_NODES) -> list[tuple[str, int]]:
    """(gfx arch, PCI device id) of each AMD GPU in the KFD topology, in node order; CPU nodes are skipped."""
    found = []
    for node in sorted(glob.glob(f"{nodes_dir}/*"), key=_node_index):
        properties = _properties(_read(f"{node}/properties") or "")
        target = properties.get("gfx_target_version", "0")
        if target.isdigit() and int(target):
            device_id = properties.get("device_id", "0")
            found.append((gfx_arch(int(target)), int(device_id) if device_id.isdigit() else 0))
    return found


def amd_accelerators(nodes_dir: str = _KFD_NODES, version_file: str = _AMDGPU_VERSION) -> list[Accelerator]:
    """AMD GPUs named by architecture and PCI id (a card swap changes the name), with the amdgpu driver version."""
    driver = _read(version_file) or None  # the in-tree driver has no version file: the kernel release says it
    return [Accelerator(backend="cuda", name=f"AMD {arch} (device 0x{device_id:04x})", driver=driver)
            for arch, device_id in amd_gpus(nodes_dir)]


def nvidia_driver_version(root: str = _PROC_DRIVER) -> str | None:
    """The NVIDIA kernel driver's version from /proc (Linux), without touching CUDA."""
    try:
        with open(f"{root}/version", encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
    parts = first.split("Kernel Module")
    return parts[1].split()[0] if len(parts) > 1 and parts[1].split() else first.strip() or None


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU as the driver lists it, in PCI bus order; ``uuid`` only matches CUDA_VISIBLE_DEVICES, never stored."""

    name: str
    uuid: str
    driver: str | None = None


def proc_gpus(root: str = _PROC_DRIVER) -> list[NvidiaGpu]:
    """Every NVIDIA GPU from ``/proc/driver/nvidia/gpus/<PCI bus id>/information``, in PCI bus order."""
    driver = nvidia_driver_version(root)
    gpus = []
    for info in sorted(glob.glob(f"{root}/gpus/*/information")):
        try:
            with open(info, encoding="utf-8") as f:
                fields = {key.strip(): value for key, _, value in (line.partition(":") for line in f)}
        except OSError:
            continue
        name = fields.get("Model", "").strip()
        if name:
            gpus.append(NvidiaGpu(name, fields.get("GPU UUID", "").strip(), driver))
    return gpus


def parse_nvidia_smi(text: str) -> list[NvidiaGpu]:
    """``nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader`` in its index order
    (PCI bus order), e.g. ``'0, GPU-5d1c..., NVIDIA GeForce RTX 2070, 546.33'``."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        # A name never holds a comma in practice, but split from both ends to be safe.
        gpus.append((int(parts[0]), NvidiaGpu(", ".join(parts[2:-1]), parts[1], parts[-1] or None)))
    return [gpu for _, gpu in sorted(gpus, key=lambda pair: pair[0])]


def _nvidia_smi_gpus() -> list[NvidiaGpu]:
    # Off Linux there is no /proc; nvidia-smi ships with every NVIDIA driver (Windows included).
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


def visible(gpus: list[NvidiaGpu], cuda_visible_devices: str | None) -> list[NvidiaGpu]:
    """The GPUs CUDA will show, in its order, under ``CUDA_VISIBLE_DEVICES`` (None: unset, all of them).

    Entries are indices or (prefixes of) ``GPU-`` UUIDs; like CUDA, the list stops at the first entry that
    names no GPU (or one already listed), so ``''`` and ``'-1'`` hide every GPU. Indices follow PCI bus order,
    which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; that variable is in the fingerprint too.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[NvidiaGpu] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if entry.isdigit():
            gpu = gpus[int(entry)] if int(entry) < len(gpus) else None
        elif entry.startswith("GPU-"):
            matches = [g for g in gpus if g.uuid and g.uuid.startswith(entry)]
            gpu = matches[0] if len(matches) == 1 else None
        else:
            gpu = None  # '-1', MIG instances, garbage: CUDA stops here
        if gpu is None or gpu in chosen:
            break
        chosen.append(gpu)
    return chosen


def _nvml_handle(device: str) -> Any:
    """NVML's handle of a CUDA device, found by its UUID (NVML numbers GPUs its own way), or why there is none."""
    if torch.version.hip is not None:
        return "not an NVIDIA GPU: ROCm reports no NVML clock events"
    try:
        import pynvml
    except ImportError:
        return NVML_HINT
    try:
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID((uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}").encode())
    except pynvml.NVMLError as exc:
        return f"NVML cannot read {device}: {exc}"


def _nvml_reasons(pynvml: Any, handle: Any) -> int:
    """The clock-event bitmask: NVML 12.535 renamed the throttle reasons "clock events"; older drivers and
    bindings have only the old name, later ones may drop it."""
    if hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons"):
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError_FunctionNotFound:
            pass
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def nvidia_hardware_present() -> bool:
    return os.path.exists(_PROC_DRIVER) or bool(sys.platform != "linux" and shutil.which("nvidia-smi"))


class CudaBackend(Backend):
    name = "cuda"
    title = "CUDA"
    device_type = "cuda"
    async_copies = True
    asynchronous = True
    lightning_accelerator = "cuda"
    forks_rng = True
    visible_device_variables = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
                                "ROCR_VISIBLE_DEVICES")

    def __init__(self) -> None:
        #: each device's NVML handle, or why there is none; found once
        self._nvml: dict[str, Any] = {}
        #: (allocated, reserved) bytes live on each device when its peak window started
        self._live: dict[str, tuple[int, int]] = {}

    def host_accelerators(self) -> list[Accelerator]:
        if torch.version.cuda is None and torch.version.hip is None:
            return []
        if torch.version.hip is not None:
            return amd_accelerators() if sys.platform == "linux" else []
        gpus = proc_gpus() if sys.platform == "linux" else []
        if not gpus:
            # No /proc view (Windows, some containers): ask the driver's own tool, which needs no CUDA context.
            gpus = _nvidia_smi_gpus()
        shown = visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return [Accelerator(backend="cuda", name=gpu.name, driver=gpu.driver) for gpu in shown]

    def unusable_reason(self) -> str | None:
        if torch.version.cuda is None and torch.version.hip is None:
            hint = "; NVIDIA driver found" if nvidia_hardware_present() else ""
            return f"this torch build has no CUDA support{hint}"
        if not torch.cuda.is_available():
            return (
                f"torch {torch.__version__} was built for CUDA {torch.version.cuda} but finds no usable GPU "
                "(no device, or a driver older than the build needs)"
            )
        return None

    def devices(self) -> list[str]:
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]

    def capability(self, device: str) -> tuple[int, int]:
        return torch.cuda.get_device_capability(torch.device(device))

    def precisions(self, device: str) -> list[Precision]:
        major, _ = self.capability(device)
        found: list[Precision] = ["fp32"]
        if major >= 8 and torch.version.hip is None:
            found.append("tf32")
        found += ["bf16-mixed", "fp16-mixed"]
        return found

    def device_name(self, device: str) -> str:
        props = torch.cuda.get_device_properties(torch.device(device))
        memory = f"{props.total_memory / 2**30:.0f} GiB"
        if torch.version.hip is not None:
            arch = str(getattr(props, "gcnArchName", "unknown gfx arch"))
            native = "native bf16" if rocm_native_bf16(arch) else "bf16 emulated"
            return (f"{props.name}, {arch.split(':', 1)[0]} ({native}), HIP {torch.version.hip}, {memory}, "
                    f"{props.multi_processor_count} CUs")
        major, minor = props.major, props.minor
        native = "native bf16" if major >= 8 else "bf16 emulated"
        sms = props.multi_processor_count
        return f"{props.name}, compute capability {major}.{minor} ({native}), {memory}, {sms} SMs"

    def profiler_activity(self) -> torch.profiler.ProfilerActivity | None:
        return torch.profiler.ProfilerActivity.CUDA

    def diagnose(self) -> list[Finding]:
        findings = []
        build = torch.__version__
        if torch.version.cuda is None and torch.version.hip is None and nvidia_hardware_present():
            driver = nvidia_driver_version()
            findings.append(Finding(
                level="error",
                message=f"an NVIDIA driver{f' {driver}' if driver else ''} is installed but torch {build} has no CUDA "
                "support: training will run on the CPU",
                fix="install a CUDA build of torch that matches the driver, then run "
                "`python -m autotune --recalibrate`",
            ))
        if torch.version.cuda is not None and not torch.cuda.is_available():
            driver = nvidia_driver_version()
            findings.append(Finding(
                level="error",
                message=f"torch {build} was built for CUDA {torch.version.cuda} but finds no usable GPU"
                + (f" (driver {driver})" if driver else " (no NVIDIA driver found)"),
                fix="update the NVIDIA driver to one that supports this CUDA version, or install a torch build for "
                "an older CUDA; check that CUDA_VISIBLE_DEVICES does not hide the GPU",
            ))
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
            findings.append(Finding(level="warning", message="CUDA_VISIBLE_DEVICES is empty: every CUDA GPU is hidden",
                                    fix="unset CUDA_VISIBLE_DEVICES"))
        return findings

    def synchronize(self, device: str) -> None:
        torch.cuda.synchronize(torch.device(device))

    def apply_loop_settings(self) -> None:
        """cuDNN's benchmark mode, as fast CNN training runs: each convolution shape times cuDNN's algorithms on
        its first call (a set-up cost) and keeps the fastest, which can change which layout or precision wins.
        Not on ROCm, where it makes MIOpen search exhaustively (pytorch/pytorch#145294): the app's own setting."""
        if torch.version.hip is None:
            torch.backends.cudnn.benchmark = True

    def step_clock(self, device: str) -> StepClock | None:
        stream = torch.cuda.current_stream(torch.device(device))
        return StepClock(lambda: torch.cuda.Event(enable_timing=True), lambda event: event.record(stream))

    def clock_check(self, device: str) -> str | None:
        handle = self._nvml_handle(device)
        return handle if isinstance(handle, str) else None

    def clock_reading(self, device: str) -> ClockReading | None:
        """The SM clock and the throttle reasons in force, from NVML (the optional ``nvidia-ml-py``)."""
        handle = self._nvml_handle(device)
        if isinstance(handle, str):
            return None
        import pynvml

        try:
            return ClockReading(mhz=float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                                events=clock_events(_nvml_reasons(pynvml, handle)))
        except pynvml.NVMLError:  # a driver without the query, a GPU fallen off the bus: no reading this time
            return None

    def _nvml_handle(self, device: str) -> Any:
        """``device``'s NVML handle, or why there is none (ROCm, no ``nvidia-ml-py``, NVML's own error)."""
        if device not in self._nvml:
            self._nvml[device] = _nvml_handle(device)
        return self._nvml[device]

    def release_cached_memory(self, device: str) -> None:
        torch.cuda.empty_cache()

    def reset_peak_memory(self, device: str) -> None:
        where = torch.device(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(where)
        self._live[device] = (int(torch.cuda.memory_allocated(where)), int(torch.cuda.memory_reserved(where)))

    def peak_memory_bytes(self, device: str) -> int | None:
        return int(torch.cuda.max_memory_allocated(torch.device(device))) - self._live.get(device, (0, 0))[0]

    def peak_reserved_bytes(self, device: str) -> int | None:
        return int(torch.cuda.max_memory_reserved(torch.device(device))) - self._live.get(device, (0, 0))[1]

    def free_memory_bytes(self, device: str) -> int | None:
        """Free on the device plus the allocator's cached, unused blocks (this process can reuse those)."""
        where = torch.device(device)
        free, _ = torch.cuda.mem_get_info(where)
        return int(free + torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where))
