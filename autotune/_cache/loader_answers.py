"""The DataLoader answers: ``<cache dir>/loaders/<digest>.json``, one machine configuration's answers keyed by the
question (family, candidate, dataset signature, batch size, the user's key and fixed arguments); the ``KEPT`` most
recently measured are kept. A side file (``sidefiles``): an answers file that cannot be read or written costs a
measurement, never an error.
"""

from __future__ import annotations

from autotune._cache import sidefiles
from autotune._cache.sidefiles import SideFile
from autotune._reports import LoaderReport

FILES = SideFile("loaders", "reports", "the DataLoader answers", "measuring again")
#: answers kept per machine configuration, the most recently measured: datasets come and go
KEPT = 32


class Answers(sidefiles.Answers[LoaderReport]):
    """One machine configuration's DataLoader answers, keyed by the question."""

    def __init__(self, digest: str) -> None:
        super().__init__(FILES, LoaderReport, digest, kept=KEPT)


def clear() -> list[str]:
    """Delete every cached DataLoader answer; returns the removed paths."""
    return FILES.clear()


__all__ = ["FILES", "KEPT", "Answers", "clear"]
