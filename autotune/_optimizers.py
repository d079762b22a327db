"""Which optimizer implementation keyword (``fused`` / ``foreach``) an app's optimizer gets from a Config.

Calibration measures the fused and foreach variants with AdamW. Not every torch optimizer takes both
keywords (RMSprop, Adamax and NAdam have no ``fused``), and a caller may choose the implementation itself:
passing the measured keyword regardless would raise ``TypeError`` in either case.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from autotune._models import OptimizerImpl

log = logging.getLogger("autotune")

_IMPLEMENTATION_KEYWORDS = ("fused", "foreach")


def accepts_keyword(optimizer: Callable[..., Any], keyword: str) -> bool:
    """Whether ``optimizer(params, **{keyword: True})`` names the keyword in its signature
    (``**kwargs`` does not count)."""
    try:
        parameters = inspect.signature(optimizer).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: do not guess
        return False
    parameter = parameters.get(keyword)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def optimizer_kwargs_for(
    optimizer: Callable[..., Any], implementation: OptimizerImpl, options: Mapping[str, Any]
) -> dict[str, bool]:
    """``{"fused": True}`` when ``implementation`` is "fused", ``optimizer`` takes it and ``options`` do not choose.

    The caller's own ``fused=`` / ``foreach=`` in ``options`` wins (INFO log); an optimizer without the keyword
    gets nothing (WARNING log: the measured gain is not realised).
    """
    if implementation == "default":
        return {}
    name = getattr(optimizer, "__qualname__", repr(optimizer))
    chosen = [k for k in _IMPLEMENTATION_KEYWORDS if k in options]
    if chosen:
        log.info("%s: the caller's %s wins over the measured %s implementation", name,
                 ", ".join(f"{k}={options[k]!r}" for k in chosen), implementation)
        return {}
    if not accepts_keyword(optimizer, implementation):
        log.warning("%s takes no %s= keyword: the %s implementation calibration measured (with AdamW) is not "
                    "applied", name, implementation, implementation)
        return {}
    return {implementation: True}


__all__ = ["accepts_keyword", "optimizer_kwargs_for"]
