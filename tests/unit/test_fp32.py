"""fp32 / tf32 settings: what each precision means, read and restored through torch's per-backend API.

torch 2.13 (this CPU build) has both APIs and refuses to mix them, so everything here is real torch state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from fp32_for_tests import NODES, fp32_state

from autotune import Config
from autotune._apply import fp32 as _fp32


@pytest.fixture(autouse=True)
def untouched_settings() -> Iterator[None]:
    """Each test starts from, and leaves, every setting inherited ("none"): an app's changes then reach each one.

    (A fresh process differs in one way: convolutions and RNNs read "tf32" until something is set.)
    """
    for node in NODES.values():
        node.fp32_precision = "none"
    fresh = fp32_state()
    yield
    for node in NODES.values():
        node.fp32_precision = "none"
    assert fp32_state() == fresh


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


@pytest.mark.parametrize("app", list(APP_SETTINGS), ids=list(APP_SETTINGS))
def test_precisions_mean_what_they_say_and_the_app_settings_come_back_exactly(app: str) -> None:
    APP_SETTINGS[app]()
    before = fp32_state()
    legacy_before = torch.get_float32_matmul_precision() if app in ("untouched", "legacy high") else None
    with _fp32.preserved():
        _fp32.apply("fp32")
        assert {n: v for n, v in fp32_state().items() if "." in n} == dict.fromkeys(_fp32.current().values, "ieee")
        _fp32.apply("tf32")
        state = fp32_state()
        assert (state["cuda.matmul"], state["cudnn.conv"], state["cudnn.rnn"]) == ("tf32", "tf32", "tf32")
        assert state["mkldnn.matmul"] == state["mkldnn.conv"] == "ieee"
        _fp32.apply("bf16-mixed")  # mixed precision leaves fp32 operations to the app
        assert fp32_state() == state
    assert fp32_state() == before
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
        before = fp32_state()
        _config("bf16-mixed").apply_precision()
        assert fp32_state() == before
