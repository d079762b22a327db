"""None"""

from __future__ import annotations

import getpass
import json
import os
import socket

import pytest

import autotune
from autotune._fingerprint import (
    REVISION,
    THREAD_VARIABLES,
    Fingerprint,
    default_threads,
    device_variables,
    kernel_release,
)
from autotune.backends import Accelerator
from autotune.testing import reset_state


def test_fingerprint_is_stable_within_a_process() -> None:
    assert autotune.fingerprint().digest == autotune.fingerprint().digest


CHANGES = {
    "os": "Darwin",
    "os_release": "0.0",
    "arch": "arm64",
    "python": "3.99",
    "torch": "9.9.9",
    "cuda": "12.4",
    "hip": "6.0",
    "cudnn": 90100,
    "cpu_brand": "Apple M1",
    "cpu_isa": ["neon"],
    "cpu_capability": "DEFAULT",
    "usable_cores": 1,
    "cpu_quota": 0.25,
    "ram_gib": 16,
    "accelerators": [Accelerator(backend="cuda", name="NVIDIA GeForce RTX 2070", driver="550.54")],
    "environment": {"OMP_NUM_THREADS": "3"},
    "revision": REVISION - 1,
}


def test_every_field_is_covered_by_a_change() -> None:
    assert set(CHANGES) == set(Fingerprint.model_fields)


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_digest_changes_when_a_keyed_field_changes(field: str) -> None:
    here = autotune.fingerprint()
    assert getattr(here, field) != CHANGES[field]
    changed = Fingerprint.model_validate({**here.model_dump(exclude={"digest"}), field: CHANGES[field]})
    assert changed.digest != here.digest


def test_accelerator_driver_change_changes_digest() -> None:
    base = autotune.fingerprint().model_dump(exclude={"digest"})
    gpu = {"backend": "cuda", "name": "RTX 3090"}
    old = Fingerprint.model_validate({**base, "accelerators": [{**gpu, "driver": "535"}]})
    new = Fingerprint.model_validate({**base, "accelerators": [{**gpu, "driver": "550"}]})
    assert old.digest != new.digest


def test_the_device_variables_are_the_backends_in_their_order() -> None:
    # The order is the order of the fingerprint's environment field in the results files.
    assert device_variables() == ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
                                  "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


@pytest.mark.parametrize("variable", [*device_variables(), *THREAD_VARIABLES])
def test_each_device_and_thread_variable_alone_changes_the_digest(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read after reset_state() is a new process's: the budget is read once per process.
    for name in (*device_variables(), *THREAD_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    reset_state()
    unset = autotune.fingerprint().digest
    monkeypatch.setenv(variable, "1")
    reset_state()
    one = autotune.fingerprint()
    assert one.digest != unset and one.environment == {variable: "1"}
    monkeypatch.setenv(variable, "0")
    reset_state()
    assert autotune.fingerprint().digest not in (unset, one.digest)
    monkeypatch.delenv(variable)
    reset_state()
    assert autotune.fingerprint().digest == unset


def test_an_empty_cuda_visible_devices_is_not_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    reset_state()
    unset = autotune.fingerprint().digest
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every GPU
    reset_state()
    assert autotune.fingerprint().digest != unset


@pytest.mark.parametrize("variable", ["LANG", "TERM", "PATH", "MY_APP_SETTING", "AUTOTUNE_BUDGET_S", "PYTHONHASHSEED"])
def test_unrelated_environment_changes_keep_the_digest(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = autotune.fingerprint().digest
    monkeypatch.setenv(variable, "something-else")
    reset_state()
    assert autotune.fingerprint().digest == before


def test_fewer_usable_cores_are_another_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    before = autotune.fingerprint()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # what `taskset -c 0` leaves
    assert autotune.fingerprint() == before  # read once per process
    reset_state()
    assert autotune.fingerprint().usable_cores == 1
    assert (autotune.fingerprint().digest != before.digest) == (before.usable_cores != 1)


def test_the_budget_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    before = autotune.fingerprint(), autotune.fingerprint(processes=2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # set too late: torch's pools are sized
    assert (autotune.fingerprint(), autotune.fingerprint(processes=2)) == before


def test_the_apps_thread_count_is_not_in_the_digest() -> None:
    import torch

    before, threads = autotune.fingerprint().digest, torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # the conftest puts the count back
    assert autotune.fingerprint().digest == before
    reset_state()  # as a process that set its count before its first read
    assert autotune.fingerprint().digest == before
    assert "torch_threads" not in autotune.fingerprint().model_dump()


def test_torchs_default_thread_count_is_read_before_the_app_changes_it() -> None:
    import torch

    threads = torch.get_num_threads()
    autotune.fingerprint()
    torch.set_num_threads(threads + 1)  # the conftest puts the count back
    assert default_threads() == threads


def test_a_record_from_before_the_revision_is_not_this_machines_own() -> None:
    """A record written when the digest held torch's thread count of the moment: loaded now, it is another
    machine configuration (a similar one), never the file this machine answers from."""
    here = autotune.fingerprint()
    old = {**here.model_dump(exclude={"digest", "cpu_quota", "revision"}), "torch_threads": 2}
    loaded = Fingerprint.model_validate(old)
    assert loaded.revision == 1 and loaded.digest != here.digest


def test_matmul_precision_of_the_host_is_not_in_the_digest() -> None:
    # The worker sets each candidate's own matmul precision; the host's setting does not change measurements.
    import torch

    before = autotune.fingerprint().digest
    torch.set_float32_matmul_precision("medium")
    try:
        assert autotune.fingerprint().digest == before
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize(
    ("release", "kept"),
    [("6.8.0-45-generic", "6.8"), ("6.8.12-1-pve", "6.8"), ("5.15.153.1-microsoft-standard-WSL2", "5.15"),
     ("23.5.0", "23.5"), ("10", "10"), ("", "")],
    ids=["ubuntu", "proxmox", "wsl2", "darwin", "windows", "unknown"],
)
def test_only_the_kernel_major_minor_is_kept(release: str, kept: str) -> None:
    assert kernel_release(release) == kept


def test_a_kernel_patch_update_keeps_the_digest() -> None:
    here = autotune.fingerprint().model_dump(exclude={"digest"})
    a = Fingerprint.model_validate({**here, "os_release": kernel_release("6.8.0-45-generic")})
    b = Fingerprint.model_validate({**here, "os_release": kernel_release("6.8.0-49-generic")})
    assert a.digest == b.digest


def test_fingerprint_holds_no_personal_identifiers() -> None:
    text = json.dumps(autotune.fingerprint().model_dump()).lower()
    assert socket.gethostname().lower() not in text
    assert getpass.getuser().lower() not in text
    forbidden = {"hostname", "host", "user", "username", "serial", "uuid", "mac"}
    assert forbidden.isdisjoint(Fingerprint.model_fields)


def test_fingerprint_describes_this_cpu() -> None:
    fp = autotune.fingerprint()
    assert fp.usable_cores >= 1 and fp.ram_gib >= 1
    assert fp.cpu_brand
    assert len(fp.digest) == 16
