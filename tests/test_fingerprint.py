from __future__ import annotations

import getpass
import json
import socket
import subprocess
import sys

import pytest

import autotune
from autotune._fingerprint import Fingerprint
from autotune.backends import Accelerator


def test_fingerprint_is_stable_within_a_process() -> None:
    assert autotune.fingerprint().digest == autotune.fingerprint().digest


def test_fingerprint_is_stable_across_processes() -> None:
    code = "import autotune; print(autotune.fingerprint().digest)"
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert digests == {autotune.fingerprint().digest}


CHANGES = {
    "measurement_version": 99,
    "os": "Darwin",
    "os_release": "0.0.0",
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
    "ram_gib": 16,
    "float32_matmul_precision": "high",
    "accelerators": [Accelerator(backend="cuda", name="NVIDIA GeForce RTX 2070", driver="550.54")],
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
    old = Fingerprint.model_validate({**base, "accelerators": [{"backend": "cuda", "name": "RTX 3090", "driver": "535"}]})
    new = Fingerprint.model_validate({**base, "accelerators": [{"backend": "cuda", "name": "RTX 3090", "driver": "550"}]})
    assert old.digest != new.digest


def test_matmul_precision_set_by_the_app_changes_the_digest() -> None:
    import torch

    before = autotune.fingerprint().digest
    torch.set_float32_matmul_precision("medium")
    try:
        assert autotune.fingerprint().digest != before
    finally:
        torch.set_float32_matmul_precision("highest")
    assert autotune.fingerprint().digest == before


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
