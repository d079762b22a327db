"""The rule every reason keeps, shared by conftest's ``reasons`` fixture and the wording's own tests."""

from __future__ import annotations

import re

from autotune import _wording


def one_sentence_problem(reason: str) -> str | None:
    """Why ``reason`` is not one sentence of at most ``_wording.REASON_CHARS`` characters; None when it is."""
    if len(reason) > _wording.REASON_CHARS:
        return f"{len(reason)} characters"
    if "\n" in reason or re.search(r"[.!?]\s+[A-Z]", reason):
        return "more than one sentence"
    return None
