"""The fingerprint's platform readers on recorded outputs (fixtures/platforms/, see its README for provenance).

Only the OS boundary is replaced: a /proc or sysfs tree built in tmp_path, the text a tool prints, the registry.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from autotune import _quota
from autotune.backends import _darwin, _windows, cuda, xpu

PLATFORMS = Path(__file__).parents[2] / "fixtures" / "platforms"


def _recorded(name: str) -> str:
    return (PLATFORMS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("recording", "machine", "brand", "flags"),
    [
        pytest.param("darwin-m1-sysctl.txt", "arm64", "Apple M1", {"neon"}, id="apple-m1-no-bf16"),
        pytest.param("darwin-m2-sysctl.txt", "arm64", "Apple M2", {"neon", "bf16"}, id="apple-m2-bf16"),
        pytest.param("darwin-intel-sysctl.txt", "x86_64", "Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz", set(),
                     id="intel-mac-unknown-arm-name"),
    ],
)
def test_macos_sysctl(recording: str, machine: str, brand: str, flags: set[str]) -> None:
    assert _darwin.apple_cpu(_darwin.parse_sysctl(_recorded(recording)), machine) == (brand, flags)


def test_windows_cpu_name_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The recorded `reg query` line: the value after REG_SZ, with the trailing spaces Intel's names carry.
    line = next(x for x in _recorded("windows-cpu-registry.txt").splitlines() if "REG_SZ" in x)
    value = line.split("REG_SZ", 1)[1].lstrip()
    assert value.endswith(" ")
    key = object()
    fake = types.ModuleType("winreg")
    fake.HKEY_LOCAL_MACHINE = "HKLM"  # type: ignore[attr-defined]

    class OpenKey:
        def __init__(self, root: str, path: str) -> None:
            assert (root, path) == ("HKLM", r"HARDWARE\DESCRIPTION\System\CentralProcessor\0")

        def __enter__(self) -> object:
            return key

        def __exit__(self, *exc: object) -> None:
            return None

    def query_value_ex(opened: object, name: str) -> tuple[str, int]:
        assert opened is key and name == "ProcessorNameString"
        return value, 1

    fake.OpenKey = OpenKey  # type: ignore[attr-defined]
    fake.QueryValueEx = query_value_ex  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "winreg", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    assert _windows.cpu_name() == "Intel(R) Core(TM) i9-10900K CPU @ 3.70GHz"


def test_windows_cpu_name_is_empty_when_the_registry_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("winreg")
    fake.HKEY_LOCAL_MACHINE = "HKLM"  # type: ignore[attr-defined]

    def refuse(*args: object) -> None:
        raise PermissionError("access denied")

    fake.OpenKey = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "winreg", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    assert _windows.cpu_name() == ""


def test_windows_nvidia_smi() -> None:
    gpus = cuda.parse_nvidia_smi(_recorded("windows-nvidia-smi.csv"))
    assert [(g.name, g.driver) for g in gpus] == [
        ("NVIDIA GeForce RTX 3090", "552.22"), ("NVIDIA GeForce RTX 2070", "552.22"),
    ]
    # Windows has no /proc: CUDA_VISIBLE_DEVICES applies to nvidia-smi's list the same way.
    assert [g.name for g in cuda.visible(gpus, "1")] == ["NVIDIA GeForce RTX 2070"]


@pytest.fixture
def proc_nvidia(tmp_path: Path) -> Path:
    """The recorded /proc/driver/nvidia of a two-GPU Linux box, rebuilt (':' cannot be in a Windows checkout)."""
    root = tmp_path / "proc-driver-nvidia"
    root.mkdir()
    (root / "version").write_text(_recorded("linux-nvidia-version.txt"))
    for recording in sorted(PLATFORMS.glob("linux-nvidia-information-*.txt")):
        bus = recording.stem.removeprefix("linux-nvidia-information-").replace("_", ":")
        (root / "gpus" / bus).mkdir(parents=True)
        (root / "gpus" / bus / "information").write_text(recording.read_text())
    return root


def test_linux_proc_lists_gpus_in_pci_order_with_the_driver(proc_nvidia: Path) -> None:
    gpus = cuda.proc_gpus(str(proc_nvidia))
    assert [(g.name, g.driver) for g in gpus] == [
        ("NVIDIA GeForce RTX 3090", "550.54.15"), ("NVIDIA GeForce RTX 2070", "550.54.15"),
    ]


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        pytest.param(None, ["RTX 3090", "RTX 2070"], id="unset-all"),
        pytest.param("0,1", ["RTX 3090", "RTX 2070"], id="both"),
        pytest.param("1", ["RTX 2070"], id="second-only"),
        pytest.param("1,0", ["RTX 2070", "RTX 3090"], id="reordered"),
        pytest.param("", [], id="empty-hides-all"),
        pytest.param("-1", [], id="minus-one-hides-all"),
        pytest.param("0,7,1", ["RTX 3090"], id="stops-at-invalid-index"),
        pytest.param("0,0", ["RTX 3090"], id="duplicate-stops"),
        pytest.param("GPU-8c7d5e10", ["RTX 2070"], id="uuid-prefix"),
        pytest.param("GPU-", [], id="ambiguous-uuid-prefix"),
        pytest.param(" 1 , 0 ", ["RTX 2070", "RTX 3090"], id="spaces"),
    ],
)
def test_cuda_visible_devices_selects_and_orders_proc_gpus(
    proc_nvidia: Path, visible: str | None, names: list[str]
) -> None:
    shown = cuda.visible(cuda.proc_gpus(str(proc_nvidia)), visible)
    assert [g.name.removeprefix("NVIDIA GeForce ") for g in shown] == names


def _pci_device(root: Path, bus: str, vendor: str, pci_class: str, device: str, driver: str | None) -> None:
    node = root / bus
    node.mkdir(parents=True)
    (node / "vendor").write_text(vendor + "\n")
    (node / "class").write_text(pci_class + "\n")
    (node / "device").write_text(device + "\n")
    if driver is not None:
        target = root.parent / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (node / "driver").symlink_to(target)


def test_intel_gpus_from_sysfs_without_the_runtime(tmp_path: Path) -> None:
    pci = tmp_path / "devices"
    _pci_device(pci, "0000_00_02.0", "0x8086", "0x030000", "0x4680", "i915")   # an integrated UHD 770
    _pci_device(pci, "0000_03_00.0", "0x8086", "0x030000", "0x56A0", "xe")     # an Arc A770
    _pci_device(pci, "0000_00_14.0", "0x8086", "0x0c0330", "0x7ae0", "xhci")   # a USB controller: not a GPU
    _pci_device(pci, "0000_01_00.0", "0x10de", "0x030000", "0x2204", None)     # an NVIDIA card: not XPU
    assert xpu.sysfs_gpus(str(pci)) == [("Intel GPU 8086:4680", "i915"), ("Intel GPU 8086:56a0", "xe")]


@pytest.mark.parametrize(
    ("mask", "indices"),
    [(None, [0, 1]), ("1", [1]), ("1,0", [1, 0]), ("0.0,0.1", [0]), ("5", []), ("", [0, 1])],
    ids=["unset", "second", "reordered", "sub-devices", "no-such-device", "empty-as-unset"],
)
def test_ze_affinity_mask(mask: str | None, indices: list[int]) -> None:
    assert xpu.visible_indices(2, mask) == indices


def _cgroups(tmp_path: Path, groups: str, mounts: list[tuple[str, str, str, str]],
             files: dict[str, str]) -> str:
    """A machine under tmp_path, as ``autotune._quota`` reads one from its ROOT: /proc/self's ``cgroup`` text, a
    ``mountinfo`` line per (root, mount point, type, super options), and the cgroup files; returns the ROOT."""
    proc = tmp_path / "proc/self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(groups)
    (proc / "mountinfo").write_text("".join(
        f"{30 + i} 25 0:{26 + i} {root} /{point} rw,nosuid,nodev,noexec,relatime shared:{i} - {kind} "
        f"{kind} {options}\n" for i, (root, point, kind, options) in enumerate(mounts)))
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return str(tmp_path)


V2 = [("/", "sys/fs/cgroup", "cgroup2", "rw,nsdelegate,memory_recursiveprot")]


@pytest.mark.parametrize(
    ("groups", "mounts", "files", "quota"),
    [
        pytest.param("0::/\n", V2, {"sys/fs/cgroup/cgroup.controllers": "cpu memory\n"}, None,
                     id="v2-root-no-limit"),
        pytest.param("0::/kubepods/pod1/c1\n", V2,
                     {"sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "max 100000\n",
                      "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
                      "sys/fs/cgroup/kubepods/cpu.max": "400000 100000\n"}, 1.5, id="v2-a-parents-limit-holds"),
        pytest.param("0::/\n", V2, {"sys/fs/cgroup/cpu.max": "50000 100000\n"}, 0.5,
                     id="v2-a-containers-own-group-at-the-mount"),
        pytest.param("0::/user.slice\n", V2, {"sys/fs/cgroup/user.slice/cpu.max": "max 100000\n"}, None,
                     id="v2-max-is-no-limit"),
        pytest.param("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n",
                     [("/docker/abc", "sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct")],
                     {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                      "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 2.0,
                     id="v1-docker-cpus-2"),
        pytest.param("4:memory:/a\n1:cpu:/\n0::/\n",
                     [("/", "sys/fs/cgroup/cpu", "cgroup", "rw,cpu"), ("/", "sys/fs/cgroup/memory", "cgroup",
                                                                         "rw,memory")],
                     {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
                      "sys/fs/cgroup/memory/a/memory.limit_in_bytes": "1\n"}, None, id="v1-unlimited"),
    ],
)
def test_the_cpu_quota_of_control_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, groups: str,
                                         mounts: list[tuple[str, str, str, str]], files: dict[str, str],
                                         quota: float | None) -> None:
    monkeypatch.setattr(_quota, "ROOT", _cgroups(tmp_path, groups, mounts, files))
    found = _quota.cpu_quota()
    assert (found.cores if found is not None else None) == quota


def test_no_control_groups_to_read_is_no_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_quota, "ROOT", str(tmp_path / "no-proc"))
    assert _quota.cpu_quota() is None
