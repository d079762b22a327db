"""The max-batch answers: ``<cache dir>/max_batch/<digest>.json``, one machine configuration's answers keyed by
the question (family, candidate, limit, margin).

Read and written like the results files: never through a link, never more than ``MAX_FILE_BYTES``, under a
lock, whole or not at all. An answers file that cannot be read or written costs a measurement, never an error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from autotune._cache import disk as _disk
from autotune._cache.locks import lock_file
from autotune._cache.store import default_root
from autotune._env import LOCK_TIMEOUT_S
from autotune._records import MaxBatchReport, Record

log = logging.getLogger("autotune")


#: what becomes of the answers of a max-batch cache that cannot be read: nothing is measured until one is asked for
_AGAIN = "its answers are measured again when asked for"


class AnswersFile(Record):
    schema_version: int = 1
    reports: dict[str, MaxBatchReport]


def cache_dir() -> Path:
    return default_root() / "max_batch"


class Answers:
    """One machine configuration's max-batch answers, keyed by the question."""

    def __init__(self, digest: str) -> None:
        self.path = cache_dir() / f"{digest}.json"

    def _read(self) -> dict[str, MaxBatchReport]:
        problem = _disk.directory_problem(self.path.parent)
        if problem is not None:
            log.warning("ignoring the max-batch cache in %s (%s); %s", self.path.parent, problem, _AGAIN)
            return {}
        try:
            data, _ = _disk.read_regular(self.path)
        except FileNotFoundError:
            return {}
        except _disk.Refused as exc:
            log.warning("ignoring the max-batch cache %s (%s); %s", self.path, exc, _AGAIN)
            return {}
        except OSError as exc:
            log.warning("ignoring the max-batch cache %s (%s); %s", self.path, _disk.os_reason(exc), _AGAIN)
            return {}
        if data is None:
            log.warning("ignoring the max-batch cache %s (larger than any answers file); %s", self.path, _AGAIN)
            return {}
        try:
            return AnswersFile.model_validate_json(data).reports
        except ValidationError as exc:
            log.warning("ignoring the unreadable max-batch cache %s (%s); %s", self.path,
                        exc.errors()[0].get("msg", "invalid"), _AGAIN)
            return {}

    def get(self, key: str) -> MaxBatchReport | None:
        return self._read().get(key)

    def put(self, key: str, report: MaxBatchReport) -> None:
        lock = lock_file(self.path.parent, f"{self.path.name}.lock", "the max-batch answer is measured again next time")
        if lock is None:
            return
        try:
            with lock.acquire(timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                reports = {**self._read(), key: report}
                document = json.loads(AnswersFile(reports=reports).model_dump_json())
                _disk.remove_stale_temps(self.path)
                _disk.write_atomic(self.path, _disk.strict_json(document))
        except (OSError, TimeoutError) as exc:  # filelock.Timeout is a TimeoutError
            log.warning("cannot store the max-batch answer in %s (%s); it is measured again next time",
                        self.path, exc)


def clear() -> list[str]:
    """Delete every cached max-batch answer; returns the removed paths."""
    removed = []
    for path in sorted(cache_dir().glob("*.json")):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(str(path))
    return removed


__all__ = ["Answers", "AnswersFile", "cache_dir", "clear"]
