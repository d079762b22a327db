"""The largest batch that fits: ``autotune.max_batch_size("cnn", memory_limit_mb=4096)`` (issue #15).

The search itself (two probes, a fitted line, confirmation with real steps) is
:func:`autotune._batch_search.find_max_batch`; here are the entry points, which run its probes in the
calibration worker, and their cache.

Answers are cached per machine (fingerprint), family (build reference and version), candidate, limit and
margin, in ``<cache dir>/max_batch/<digest>.json``, written like the results files (lock, temp + fsync +
``os.replace``); a cache that cannot be read or written costs a measurement, never an error.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from autotune._batch_search import find_max_batch, mib_words
from autotune._errors import ConfigurationError
from autotune._models import PRECISIONS, Candidate, Precision, Record
from autotune._reports import MaxBatchReport

if TYPE_CHECKING:
    from autotune._calibration.protocol import MemoryProbed

log = logging.getLogger("autotune")


# -- the public entry points -------------------------------------------------------------------------------


def _validate(margin: float, memory_limit_mb: float | None, precision: str | None, device: str | None) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ConfigurationError("margin", margin, "a share of the limit kept free, 0 <= margin < 1 (e.g. 0.15)")
    if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool)
                                        or not isinstance(memory_limit_mb, (int, float)) or not memory_limit_mb > 0):
        raise ConfigurationError("memory_limit_mb", memory_limit_mb, "a positive number of MiB, or None")
    if precision is not None and precision not in PRECISIONS:
        raise ConfigurationError("precision", precision, " | ".join(PRECISIONS))
    if device is not None:
        import torch

        try:
            torch.device(device)
        except RuntimeError as exc:
            raise ConfigurationError("device", device, "a torch device: cpu, cuda, cuda:1, mps, xpu") from exc


def max_batch_report(
    model_kind: str, *, device: str | None = None, precision: Precision | None = None, margin: float = 0.15,
    memory_limit_mb: float | None = None, force: bool = False,
) -> MaxBatchReport:
    """The largest batch of ``model_kind`` that fits, with the probes and the fitted line behind it.

    See :func:`max_batch_size`; ``force=True`` measures again instead of answering from the cache.
    """
    import torch

    from autotune import _fp32
    from autotune._api import best_config
    from autotune._calibrate import new_worker
    from autotune._calibration.protocol import FamilyRef, MemoryProbeJob
    from autotune._families import get_family
    from autotune._fingerprint import fingerprint

    _validate(margin, memory_limit_mb, precision, device)
    family = get_family(model_kind)
    if not family.accepts_batch_size():
        from autotune._errors import BatchSizeUnsupportedError

        raise BatchSizeUnsupportedError(family.name, family.ref)
    init_scale = None
    if device is None or precision is None:
        config = best_config(model_kind)
        chosen = (device or config.device, precision or config.precision)
        if chosen == (config.device, config.precision):
            candidate, init_scale = config.candidate, config.init_scale
        else:
            candidate = Candidate(device=chosen[0], precision=chosen[1])
    else:
        candidate = Candidate(device=str(torch.device(device)), precision=precision)
    limit_bytes = int(memory_limit_mb * 2**20) if memory_limit_mb is not None else None
    cache = _Cache(fingerprint().digest)
    key = "|".join([family.name, family.ref, family.version or "", candidate.label, f"{init_scale}", f"{margin:g}",
                    f"{limit_bytes}"])
    if not force:
        cached = cache.get(key)
        if cached is not None:
            return cached
    def probe(batch_size: int) -> MemoryProbed:
        job = MemoryProbeJob(family=FamilyRef(name=family.name, ref=family.ref), candidate=candidate,
                             init_scale=init_scale, batch_size=batch_size, fp32=_fp32.current(),
                             threads=torch.get_num_threads(), sys_path=[p for p in sys.path if p])
        return worker.run_memory_probe(job)

    log.info("measuring the largest batch of %s on %s", model_kind, candidate.label)
    with new_worker() as worker:
        report = find_max_batch(probe, model_kind=model_kind, candidate=candidate, margin=margin,
                                memory_limit_bytes=limit_bytes)
    log.info("%s on %s: batch %d fits (peak %s of %s)", model_kind, candidate.label, report.batch_size,
             mib_words(report.peak_bytes), mib_words(report.target_bytes))
    cache.put(key, report)
    return report


def max_batch_size(
    model_kind: str, *, device: str | None = None, precision: Precision | None = None, margin: float = 0.15,
    memory_limit_mb: float | None = None,
) -> int:
    """The largest batch of ``model_kind`` whose training steps fit, e.g. ``max_batch_size("cnn") -> 412``.

    ``device`` and ``precision`` default to ``best_config(model_kind)``'s (calibrating on a miss); the family's
    ``build`` must take a ``batch_size`` keyword (the built-ins do; see ``register_family``). The limit is
    ``memory_limit_mb`` or the device's free memory (CUDA ``mem_get_info``, Metal's recommended working set,
    the CPU's available RAM), whichever is lower, less ``margin`` of it. It counts what training adds to the
    process that runs it: model, gradients, optimizer state, activations and the batch (on the CPU the rise
    of the resident size, not the interpreter and torch themselves). The answer is confirmed with real steps
    in the calibration worker and cached per machine, family, device, precision, limit and margin.
    Raises MaxBatchError when not even a batch of 1 fits.
    """
    return max_batch_report(model_kind, device=device, precision=precision, margin=margin,
                            memory_limit_mb=memory_limit_mb).batch_size


# -- the cache ------------------------------------------------------------------------------------------------


class _CacheFile(Record):
    schema_version: int = 1
    reports: dict[str, MaxBatchReport]


def cache_dir() -> Path:
    from autotune._cache.store import default_root

    return default_root() / "max_batch"


class _Cache:
    """``<cache dir>/max_batch/<digest>.json``: one machine configuration's answers, keyed by the question."""

    def __init__(self, digest: str) -> None:
        self.path = cache_dir() / f"{digest}.json"

    def _read(self) -> dict[str, MaxBatchReport]:
        try:
            data = self.path.read_bytes()
        except OSError:
            return {}
        try:
            return _CacheFile.model_validate_json(data).reports
        except ValidationError as exc:
            log.warning("ignoring the unreadable max-batch cache %s (%s); measuring again", self.path,
                        exc.errors()[0].get("msg", "invalid"))
            return {}

    def get(self, key: str) -> MaxBatchReport | None:
        return self._read().get(key)

    def put(self, key: str, report: MaxBatchReport) -> None:
        import filelock

        from autotune._cache.store import write_atomic
        from autotune._env import LOCK_TIMEOUT_S

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with filelock.FileLock(f"{self.path}.lock", timeout=min(LOCK_TIMEOUT_S.get(), 30.0)):
                reports = {**self._read(), key: report}
                document = _CacheFile(reports=reports).model_dump(mode="json")
                write_atomic(self.path, json.dumps(document, indent=1).encode())
        except (OSError, filelock.Timeout) as exc:
            log.warning("cannot store the max-batch answer in %s (%s); it is measured again next time",
                        self.path, exc)


def clear_cache() -> list[str]:
    """Delete every cached max-batch answer; returns the removed paths."""
    removed = []
    for path in sorted(cache_dir().glob("*.json")):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(str(path))
    return removed


__all__ = ["clear_cache", "max_batch_report", "max_batch_size"]
