"""Dropout switched off for the numerics gate's verification window.

The gate compares each candidate's first steps with the fp32 CPU reference from the same seed. CUDA, MPS
and XPU draw random numbers from other generators than the CPU's, so the same seed gives other dropout
masks there, and a model with dropout > 0 (most real models) would differ from the reference on every GPU
candidate for reasons that say nothing about its arithmetic. The gate checks arithmetic, not the random
stream, so dropout is switched off while it runs: simpler and more robust than reproducing the CPU's masks
on every device (torch draws them inside native kernels), and the timed steps still run it as the user does.

Switched off are torch's dropout functions (``F.dropout`` and every ``nn.Dropout*`` module, which calls
them), the attention dropout of ``F.scaled_dot_product_attention`` and of ``nn.MultiheadAttention``. Other
randomness in a forward (``torch.rand`` noise, stochastic depth) is not touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_DROPOUTS: frozenset[Callable[..., Any]] = frozenset({
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
})
#: index of ``dropout_p`` in ``F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)``
_SDPA_DROPOUT_INDEX = 4


class _NoDropout(TorchFunctionMode):
    """Every dropout an identity, every attention dropout zero; everything else runs unchanged."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            return args[0] if args else kwargs["input"]  # what dropout does with training=False
        if func is F.scaled_dot_product_attention:
            if len(args) > _SDPA_DROPOUT_INDEX:
                args = (*args[:_SDPA_DROPOUT_INDEX], 0.0, *args[_SDPA_DROPOUT_INDEX + 1:])
            else:
                kwargs["dropout_p"] = 0.0
        elif func is F.multi_head_attention_forward:
            kwargs["training"] = False  # its only effect there is the attention dropout
        return func(*args, **kwargs)


@contextlib.contextmanager
def dropout_off() -> Iterator[None]:
    """Run the block with dropout switched off (see the module docstring)."""
    with _NoDropout():
        yield


__all__ = ["dropout_off"]
