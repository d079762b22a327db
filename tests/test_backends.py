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
    backend = MpsBackend()
    backend.reset_peak_memory("mps")  # 100
    backend.synchronize("mps")  # 500: the step's activations are still cached
    backend.synchronize("mps")  # 300
    assert backend.peak_memory_bytes("mps") == 500  # reads 200 now: the current value would have said 200
    backend.reset_peak_memory("mps")  # 50
    assert backend.peak_memory_bytes("mps") == 60


def test_every_backend_answers_the_whole_interface_without_a_device() -> None:
    """What the package asks of a device type comes from its backend: one module and one line per backend."""
    import torch

    from autotune import FrameworkError
    from autotune._config import Config
    from autotune._env import DEVICE
    from autotune._variants.apply import copies_non_blocking
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
