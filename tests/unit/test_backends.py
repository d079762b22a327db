"""Backend facts that need no device: ROCm architectures, Intel and AMD cards read from a sysfs tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.backends.cuda import amd_accelerators, gfx_arch, rocm_native_bf16


@pytest.mark.parametrize(("target", "arch"), [(90010, "gfx90a"), (90402, "gfx942"), (90500, "gfx950"),
                                              (90006, "gfx906"), (110000, "gfx1100"), (120001, "gfx1201")])
def test_kfd_target_versions_name_the_gfx_architecture(target: int, arch: str) -> None:
    assert gfx_arch(target) == arch


@pytest.mark.parametrize(("arch", "native"), [
    ("gfx90a:sramecc+:xnack-", True), ("gfx942", True), ("gfx950", True), ("gfx1100", True), ("gfx1201", True),
    ("gfx906", False), ("gfx908", False), ("gfx1030", False),  # gcnArch major 9 or 10: "capability >= 8" said yes
])
def test_native_bf16_on_rocm_comes_from_the_architecture(arch: str, native: bool) -> None:
    assert rocm_native_bf16(arch) is native


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_amd_gpus_are_read_from_the_kfd_topology(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    _write(nodes / "0" / "properties", "cpu_cores_count 64\ngfx_target_version 0\n")  # the CPU node
    _write(nodes / "1" / "properties", "cpu_cores_count 0\ngfx_target_version 90402\ndevice_id 29857\n")
    _write(nodes / "2" / "properties", "gfx_target_version 110000\ndevice_id 29772\n")
    _write(tmp_path / "amdgpu_version", "6.8.5\n")
    found = amd_accelerators(str(nodes), str(tmp_path / "amdgpu_version"))
    assert [(a.name, a.driver) for a in found] == [("AMD gfx942 (device 0x74a1)", "6.8.5"),
                                                   ("AMD gfx1100 (device 0x744c)", "6.8.5")]
    assert amd_accelerators(str(nodes), str(tmp_path / "missing"))[0].driver is None


def test_mps_peak_memory_is_the_largest_driver_allocation_over_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # The device boundary is faked (no Metal here): the driver allocation after each step, then at the read.
    import torch

    from autotune.backends.mps import MpsBackend

    allocations = iter([100, 500, 300, 200, 50, 60])
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: next(allocations))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: None)
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: None)
    backend = MpsBackend()
    backend.reset_peak_memory("mps")  # 100: another candidate's model, still held
    backend.synchronize("mps")  # 500: the step's activations are still cached
    backend.synchronize("mps")  # 300
    assert backend.peak_memory_bytes("mps") == 400  # reads 200 now: the current value would have said 100
    backend.reset_peak_memory("mps")  # 50
    assert backend.peak_memory_bytes("mps") == 10


def test_every_backend_answers_the_whole_interface_without_a_device() -> None:
    """What the package asks of a device type comes from its backend: one module and one line per backend."""
    import torch

    from autotune import FrameworkError
    from autotune._apply.axes import copies_non_blocking
    from autotune._config import Config
    from autotune._env import DEVICE
    from autotune.backends import Finding, all_backends, backend_for
    from autotune.backends.api import Backend

    backends = all_backends()
    assert backends[0].device_type == "cpu"  # the baseline comes first
    assert len({b.name for b in backends}) == len({b.device_type for b in backends}) == len(backends)
    for backend in backends:
        assert isinstance(backend, Backend) and backend_for(backend.device_type) is backend
        assert backend.name and backend.title
        assert isinstance(backend.async_copies, bool)
        assert backend.lightning_accelerator is None or isinstance(backend.lightning_accelerator, str)
        assert all(isinstance(v, str) and v.isupper() for v in backend.visible_device_variables)
        activity = backend.profiler_activity()
        assert activity is None or isinstance(activity, torch.profiler.ProfilerActivity)
        reason = backend.unusable_reason()
        assert reason is None or isinstance(reason, str)
        assert all(isinstance(a.name, str) and a.backend == backend.name for a in backend.host_accelerators())
        assert all(isinstance(f, Finding) for f in backend.diagnose())
        # and the places that ask: the device setting, batch copies, Lightning
        device = backend.device_type
        if reason is None:
            assert DEVICE.parse(device) in backend.devices()
        else:  # the device setting names only what this process can use, and says why not
            with pytest.raises(LookupError, match=re.escape(reason)):
                DEVICE.parse(device)
        assert copies_non_blocking(torch.device("cpu"), torch.device(device), pinned=True) is backend.async_copies
        config = Config(model_kind="k", device=device, precision="fp32", source="forced", reason="",
                        fingerprint_digest="")
        if backend.lightning_accelerator is None:
            with pytest.raises(FrameworkError, match=backend.title):
                config.lightning_kwargs()
        else:
            assert config.lightning_kwargs()["accelerator"] == backend.lightning_accelerator


def test_a_step_clock_pairs_each_marker_with_the_next() -> None:
    # The device's events are the boundary (none here): each keeps the time its queue reached it, in ms.
    from autotune.backends.api import StepClock

    class Event:
        def __init__(self) -> None:
            self.at_ms = 0.0

        def elapsed_time(self, end_event: Event) -> float:
            return end_event.at_ms - self.at_ms

    reached = iter([10.0, 12.5, 14.0])

    def record(event: Event) -> None:
        event.at_ms = next(reached)

    clock = StepClock(Event, record)
    for _ in range(3):
        clock.mark()
    assert clock.intervals_s() == [pytest.approx(0.0025), pytest.approx(0.0015)]


def test_a_step_on_a_device_without_its_own_clock_is_timed_from_the_host() -> None:
    # Real torch on the CPU: no events, so a span less a lone step after an untimed one (one figure); the batch
    # stays pageable (copies there are not stream-ordered).
    from autotune._apply import fp32 as _fp32
    from autotune._families import get_family
    from autotune._lab.step import TrainStep, pins_batches
    from autotune._records import Candidate
    from autotune.backends import backend_for

    backend = backend_for("cpu")
    step = TrainStep(get_family("tiny_mlp"), Candidate(device="cpu", precision="fp32"), backend, seed=0,
                     fp32_host=_fp32.current())
    assert not pins_batches(backend) and not any(t.is_pinned() for t in step.inputs)
    assert backend.step_clock("cpu") is None
    with step.selected():
        figures = step.span(3)
    assert len(figures) == 1 and figures[0] > 0


@pytest.mark.parametrize(("mask", "events"), [
    (0x0, []), (0x1, []), (0x2 | 0x10 | 0x100, []),  # idle, application clocks, sync boost, display: no throttle
    (0x4, ["power_cap"]), (0x1 | 0x4, ["power_cap"]), (0x20, ["thermal"]), (0x40 | 0x20, ["thermal"]),
    (0x8, ["hw_slowdown"]), (0x80, ["hw_slowdown"]), (0x4 | 0x40 | 0x8, ["hw_slowdown", "power_cap", "thermal"]),
], ids=lambda value: hex(value) if isinstance(value, int) else "-".join(value) or "none")
def test_nvml_clock_event_masks_name_the_throttle_reasons(mask: int, events: list[str]) -> None:
    from autotune.backends.cuda import clock_events

    assert clock_events(mask) == events


def test_the_clock_check_says_why_it_is_off() -> None:
    # Here: no nvidia-ml-py (the optional [nvidia] extra), no GPU. The CPU and other backends report no events.
    from autotune.backends.cuda import NVML_HINT, CudaBackend
    from autotune.backends.mps import MpsBackend

    try:
        import pynvml  # noqa: F401 - only its absence is this test's case
    except ImportError:
        assert CudaBackend().clock_check("cuda:0") == NVML_HINT
        assert CudaBackend().clock_reading("cuda:0") is None
    else:
        pytest.skip("nvidia-ml-py is installed")
    assert MpsBackend().clock_check("mps") == "Apple Metal (MPS) reports no clock events"
