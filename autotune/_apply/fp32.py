"""How float32 matmuls, convolutions and RNNs compute: read, set and restore torch's process-wide settings.

torch 2.9 added per-backend settings (``torch.backends.cuda.matmul.fp32_precision``,
``torch.backends.cudnn.conv.fp32_precision``, ``...cudnn.rnn...``, ``torch.backends.mkldnn.*``) next to the
legacy ones (``torch.set_float32_matmul_precision``, ``torch.backends.cudnn.allow_tf32``). torch refuses to
mix them: once an app set a per-backend value, ``torch.get_float32_matmul_precision()`` raises ("mix of the
legacy and new APIs"). So a torch build that has the per-backend settings is only ever read and written
through them here, and a build that lacks them only through the legacy calls.

What the precisions mean (the same in the calibration worker and in :meth:`autotune.Config.apply_precision`):

- ``fp32``: IEEE fp32 for every matmul, convolution and RNN (cuBLAS, cuDNN, oneDNN). torch's own default
  runs cuDNN convolutions and RNNs in TF32 on Ampere and later, which is not what "fp32" says.
- ``tf32``: TF32 for CUDA matmuls, convolutions and RNNs; IEEE on the CPU (oneDNN).
- ``bf16-mixed`` / ``fp16-mixed``: autocast decides; the fp32 operations it leaves alone keep whatever the
  app set, and the calibration worker measures them with the host's settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch

from autotune import _variants
from autotune._records import Precision, Record

Api = Literal["per-backend", "legacy"]

#: the legacy settings, as this module names them
_LEGACY_MATMUL = "float32_matmul_precision"
_LEGACY_CUDNN = "cudnn.allow_tf32"


def _leaves() -> dict[str, Any]:
    """Per-backend settings this build has, by name: ``{"cuda.matmul": torch.backends.cuda.matmul, ...}``."""
    backends = torch.backends
    candidates = {
        "cuda.matmul": backends.cuda.matmul,
        "cudnn.conv": getattr(backends.cudnn, "conv", None),
        "cudnn.rnn": getattr(backends.cudnn, "rnn", None),
        "mkldnn.matmul": getattr(backends.mkldnn, "matmul", None),
        "mkldnn.conv": getattr(backends.mkldnn, "conv", None),
        "mkldnn.rnn": getattr(backends.mkldnn, "rnn", None),
    }
    return {name: leaf for name, leaf in candidates.items() if leaf is not None and hasattr(leaf, "fp32_precision")}


def api() -> Api:
    """``'per-backend'`` on torch builds with ``torch.backends.cuda.matmul.fp32_precision`` (2.9+),
    else ``'legacy'``."""
    return "per-backend" if "cuda.matmul" in _leaves() else "legacy"


class Fp32Settings(Record):
    """The process's fp32 settings, e.g. ``api='per-backend', values={'cuda.matmul': 'none', 'cudnn.conv': 'tf32'}``.

    Per-backend values are what torch's getters report ("none": inherited, IEEE when nothing above is set);
    legacy values are ``float32_matmul_precision`` ("highest" / "high" / "medium") and ``cudnn.allow_tf32``
    ("true" / "false"). Sent to the calibration worker so it measures with the host's settings.
    """

    api: Api
    values: dict[str, str]

    def summary(self) -> str:
        """e.g. ``'cuda.matmul=ieee cudnn.conv=tf32 ...'``: the effective settings ("none" reads as IEEE)."""
        return " ".join(f"{name}={'ieee' if value == 'none' else value}" for name, value in sorted(self.values.items()))


def current() -> Fp32Settings:
    """The settings in effect now, read through the one API this build has (never raises)."""
    return read(api())


def read(which: Api) -> Fp32Settings:
    """The settings in effect now, read through ``which`` API (``current()`` picks the build's own)."""
    if which == "per-backend":
        return Fp32Settings(api="per-backend", values={n: str(leaf.fp32_precision) for n, leaf in _leaves().items()})
    return Fp32Settings(api="legacy", values={
        _LEGACY_MATMUL: torch.get_float32_matmul_precision(),
        _LEGACY_CUDNN: str(bool(torch.backends.cudnn.allow_tf32)).lower(),
    })


def target(precision: Precision, host: Fp32Settings) -> Fp32Settings:
    """The settings a step of ``precision`` runs with: fixed for fp32 and tf32, the host's for mixed precision."""
    math = _variants.precision_row(precision).fp32_math
    if math is None:
        return host
    if host.api == "legacy":
        tf32 = math != "ieee"
        return Fp32Settings(api="legacy", values={
            _LEGACY_MATMUL: "high" if tf32 else "highest", _LEGACY_CUDNN: str(tf32).lower()})
    return Fp32Settings(api="per-backend", values={  # oneDNN (the CPU) computes IEEE whatever the row says
        name: "ieee" if name.startswith("mkldnn.") else math for name in host.values})


def ensure(settings: Fp32Settings) -> None:
    """Make ``settings`` the process's settings, writing only what differs (cheap enough for every step).

    A per-backend value is first tried as "none" (inherit): when that already reads back as wanted, the setting
    stays inherited, as an untouched process has it, so a later change of ``torch.backends.fp32_precision``
    by the app still reaches it. Restoring a snapshot of :func:`current` therefore gives back every value as
    torch reads it, inherited where it was. (One thing torch's API cannot express: a fresh process's
    convolutions and RNNs read "tf32" until a parent is set; restored, that "tf32" is an explicit value.)
    """
    if settings.api == "legacy":
        if torch.get_float32_matmul_precision() != settings.values[_LEGACY_MATMUL]:
            torch.set_float32_matmul_precision(settings.values[_LEGACY_MATMUL])
        allow = settings.values[_LEGACY_CUDNN] == "true"
        if bool(torch.backends.cudnn.allow_tf32) != allow:
            torch.backends.cudnn.allow_tf32 = allow
        return
    leaves = _leaves()
    for name, wanted in settings.values.items():
        leaf = leaves[name]
        if leaf.fp32_precision == wanted:
            continue
        leaf.fp32_precision = "none"
        if leaf.fp32_precision != wanted:
            leaf.fp32_precision = wanted


def apply(precision: Precision) -> None:
    """Process-wide: set what ``precision`` means (see the module docstring); mixed precisions change nothing."""
    ensure(target(precision, current()))


@contextlib.contextmanager
def preserved() -> Iterator[Fp32Settings]:
    """Restore the settings found on entry when the block ends, whatever it set; yields them."""
    before = current()
    try:
        yield before
    finally:
        ensure(before)


__all__ = ["Api", "Fp32Settings", "api", "apply", "current", "ensure", "preserved", "read", "target"]
