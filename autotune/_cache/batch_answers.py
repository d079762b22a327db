"""The max-batch answers: ``<cache dir>/max_batch/<digest>.json``, one machine configuration's answers keyed by
the question (family, candidate, limit, margin). A side file (``sidefiles``): an answers file that cannot be read
or written costs a measurement, never an error.
"""

from __future__ import annotations

from autotune._cache import sidefiles
from autotune._cache.sidefiles import SideFile
from autotune._reports import MaxBatchReport

FILES = SideFile("max_batch", "reports", "the max-batch cache", "its answers are measured again when asked for")


class Answers(sidefiles.Answers[MaxBatchReport]):
    """One machine configuration's max-batch answers, keyed by the question."""

    def __init__(self, digest: str) -> None:
        super().__init__(FILES, MaxBatchReport, digest)


def clear() -> list[str]:
    """Delete every cached max-batch answer; returns the removed paths."""
    return FILES.clear()


__all__ = ["FILES", "Answers", "clear"]
