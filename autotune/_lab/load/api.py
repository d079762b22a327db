"""The small interface every platform's reader of the operating system implements (``_proc``)."""

from __future__ import annotations

from typing import Protocol


class Reader(Protocol):
    def threads_running(self) -> bool | None:
        """Whether a thread of this process other than the caller is running now; None where it cannot tell."""


__all__ = ["Reader"]
