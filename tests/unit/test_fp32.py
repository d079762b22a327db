"""fp32 / tf32 settings: what each precision means, read and restored through torch's per-backend API.

torch 2.13 (this CPU build) has both APIs and refuses to mix them, so everything here is real torch state.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

import autotune
from autotune import Config, _fp32

B = torch.backends
#: every setting torch's per-backend API exposes here, parents included
NODES = {
    "generic": B, "cudnn": B.cudnn, "mkldnn": B.mkldnn, "cuda.matmul": B.cuda.matmul, "cudnn.conv": B.cudnn.conv,
    "cudnn.rnn": B.cudnn.rnn, "mkldnn.matmul": B.mkldnn.matmul, "mkldnn.conv": B.mkldnn.conv,
    "mkldnn.rnn": B.mkldnn.rnn,
}


def _state() -> dict[str, str]:
    return {name: node.fp32_precision for name, node in NODES.items()}


@pytest.fixture(autouse=True)
def untouched_settings() -> Iterator[None]:
    """Each test starts from, and leaves, every setting inherited ("none"): an app's changes then reach each one.

    (A fresh process differs in one way: convolutions and RNNs read "tf32" until something is set.)
    """
    for node in NODES.values():
        node.fp32_precision = "none"
    fresh = _state()
    yield
    for node in NODES.values():
        node.fp32_precision = "none"
    assert _state() == fresh


def _set(*settings: tuple[str, str]) -> Callable[[], None]:
    def apply() -> None:
        for path, value in settings:
            NODES[path].fp32_precision = value

    return apply


APP_SETTINGS = {
    "untouched": lambda: None,
    "torch's default": _set(("cudnn.conv", "tf32"), ("cudnn.rnn", "tf32")),
    "matmul tf32": _set(("cuda.matmul", "tf32")),
    "generic tf32": _set(("generic", "tf32")),
    "cudnn ieee": _set(("cudnn", "ieee")),
    "conv ieee, generic tf32": _set(("cudnn.conv", "ieee"), ("generic", "tf32")),
    "legacy high": lambda: torch.set_float32_matmul_precision("high"),
}


def _config(precision: str) -> Config:
    return Config(model_kind="cnn", device="cpu", precision=precision, source="measured",  # type: ignore[arg-type]
                  reason="test", fingerprint_digest="d")


def test_the_new_api_set_by_the_app_breaks_torchs_legacy_getter_but_not_autotune(
    monkeypatch: pytest.MonkeyPatch, tiny_family: str
) -> None:
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()  # what fingerprint() used to call
    before = _state()
    assert autotune.fingerprint().digest  # reads no fp32 setting: no crash, and the app's settings stay its own
    config = autotune.best_config(tiny_family)  # calibrates in this process: every candidate switches settings
    assert config.source == "measured"
    assert _state() == before


@pytest.mark.parametrize("app", list(APP_SETTINGS), ids=list(APP_SETTINGS))
def test_precisions_mean_what_they_say_and_the_app_settings_come_back_exactly(app: str) -> None:
    APP_SETTINGS[app]()
    before = _state()
    legacy_before = torch.get_float32_matmul_precision() if app in ("untouched", "legacy high") else None
    with _fp32.preserved():
        _fp32.apply("fp32")
        assert {n: v for n, v in _state().items() if "." in n} == dict.fromkeys(_fp32.current().values, "ieee")
        _fp32.apply("tf32")
        state = _state()
        assert (state["cuda.matmul"], state["cudnn.conv"], state["cudnn.rnn"]) == ("tf32", "tf32", "tf32")
        assert state["mkldnn.matmul"] == state["mkldnn.conv"] == "ieee"
        _fp32.apply("bf16-mixed")  # mixed precision leaves fp32 operations to the app
        assert _state() == state
    assert _state() == before
    if legacy_before is not None:  # an app on the legacy API can still read it: nothing was mixed for good
        assert torch.get_float32_matmul_precision() == legacy_before


def test_inherited_settings_stay_inherited_after_a_restore() -> None:
    torch.backends.fp32_precision = "tf32"  # every per-backend value inherits it
    with _fp32.preserved():
        _fp32.apply("fp32")
    torch.backends.fp32_precision = "none"
    # Restored by value ("tf32") they would now stay TF32; restored as inherited, they follow the app's change.
    assert torch.backends.cuda.matmul.fp32_precision == "none"
    assert torch.backends.cudnn.conv.fp32_precision == "none"


_LEGACY_ROUND_TRIP = """
import torch
from autotune import _fp32
host = _fp32.read("legacy")
assert host.values == {"float32_matmul_precision": "highest", "cudnn.allow_tf32": "true"}, host
_fp32.ensure(_fp32.target("tf32", host))
assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
_fp32.ensure(_fp32.target("fp32", host))
assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
assert _fp32.target("fp16-mixed", host) == host
_fp32.ensure(host)
assert _fp32.read("legacy") == host
print("ok")
"""


def test_the_legacy_api_for_builds_without_per_backend_settings() -> None:
    # A fresh interpreter that only ever uses the legacy calls, as on torch < 2.9 (this process mixed them).
    done = subprocess.run([sys.executable, "-c", _LEGACY_ROUND_TRIP], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_config_applies_its_precision_process_wide_and_autocast_leaves_it() -> None:
    with _fp32.preserved():
        tf32 = _config("tf32")
        with tf32.autocast():
            assert torch.backends.cuda.matmul.fp32_precision == "none"  # autocast no longer switches TF32
        tf32.apply_precision()
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        _config("fp32").apply_precision()
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"  # torch's default would be TF32
        assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
        before = _state()
        _config("bf16-mixed").apply_precision()
        assert _state() == before


def test_the_worker_measures_with_the_hosts_settings(tiny_family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A spawned worker: the settings travel in the job. The family raises (a candidate "error") unless fp32 steps
    # run IEEE and mixed-precision steps run the host's TF32 matmuls and convolutions. Every candidate runs at
    # least one step, so one the loaded machine stops as too_slow has still checked its settings.
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker's: two threads stall each other on a busy 2-core host
    autotune.register_family("fp32_settings", "families_for_tests:build_checks_fp32_settings")
    torch.backends.cudnn.fp32_precision = "tf32"  # CUDA's parent setting: matmuls, convolutions and RNNs inherit it
    measured = autotune._calibrate.measure_family("fp32_settings")
    assert {r.candidate.precision for r in measured.candidates} >= {"fp32", "bf16-mixed"}
    errors = [r.failure for r in measured.candidates if r.failure is not None and r.failure.kind == "error"]
    assert not errors
