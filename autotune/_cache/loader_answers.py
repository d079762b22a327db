"""The DataLoader answers: ``<cache dir>/loaders/<digest>.json``, one machine configuration's answers keyed by the
question (family, candidate, dataset signature, batch size, the user's key and fixed arguments).

Read and written like the max-batch answers: never through a link, never more than ``MAX_FILE_BYTES``, under a
lock, whole or not at all; the ``KEPT`` most recently measured are kept. An answers file that cannot be read or
written costs a measurement, never an error.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._cache.store import default_root
from autotune._env import LOCK_TIMEOUT_S
from autotune._records import LoaderReport, Record

log = logging.getLogger("autotune")

#: answers kept per machine configuration, the most recently measured: datasets come and go
KEPT = 32


class AnswersFile(Record):
    schema_version: int = 1
    reports: dict[str, LoaderReport]


def cache_dir() -> Path:
    return default_root() / "loaders"


class Answers:
    """One machine configuration's DataLoader answers, keyed by the question."""

    def __init__(self, digest: str) -> None:
        self.path = cache_dir() / f"{digest}.json"

    def _read(self) -> dict[str, LoaderReport]:
        problem = _disk.directory_problem(self.path.parent)
        if problem is not None:
            log.warning("ignoring the DataLoader answers in %s (%s); measuring again", self.path.parent, problem)
            return {}
        try:
            data, _ = _disk.read_regular(self.path)
        except FileNotFoundError:
            return {}
        except _disk.Refused as exc:
            log.warning("ignoring the DataLoader answers %s (%s); measuring again", self.path, exc)
            return {}
        except OSError as exc:
            log.warning("ignoring the DataLoader answers %s (%s); measuring again", self.path, _disk.os_reason(exc))
            return {}
        if data is None:
            log.warning("ignoring the DataLoader answers %s (larger than any answers file); measuring again",
                        self.path)
            return {}
        try:
            return AnswersFile.model_validate_json(data).reports
        except ValidationError as exc:
            log.warning("ignoring the unreadable DataLoader answers %s (%s); measuring again", self.path,
                        exc.errors()[0].get("msg", "invalid"))
            return {}

    def get(self, key: str) -> LoaderReport | None:
        return self._read().get(key)

    def put(self, key: str, report: LoaderReport) -> None:
        lock = lock_file(self.path.parent, f"{self.path.name}.lock",
                         "the DataLoader answer is measured again next time")
        if lock is None:
            return
        try:
            with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                reports = {**self._read(), key: report}
                kept = sorted(reports, key=lambda k: reports[k].measured_at, reverse=True)[:KEPT]
                document = AnswersFile(reports={k: reports[k] for k in kept}).model_dump(mode="json")
                _disk.remove_stale_temps(self.path)
                _disk.write_atomic(self.path, _disk.strict_json(document))
        except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
            log.warning("cannot store the DataLoader answer in %s (%s); it is measured again next time",
                        self.path, exc)


def clear() -> list[str]:
    """Delete every cached DataLoader answer; returns the removed paths."""
    removed = []
    for path in sorted(cache_dir().glob("*.json")):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(str(path))
    return removed


__all__ = ["KEPT", "Answers", "AnswersFile", "cache_dir", "clear"]
