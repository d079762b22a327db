"""Instruments for tests and benchmarks, shipped as ``torch.testing`` is: truth profiles of hardware that is not
here (:mod:`autotune.testing.truth`) drive the real measurement, search and decision code on a fake clock
(:mod:`autotune.testing.simulate`); :func:`reset_state` gives each test a process as fresh as a new one."""

from __future__ import annotations

from autotune import _answer, _background, _calibrate, _config, _env, _fingerprint
from autotune._cache import demotions, documents, exchange, freshness, locks, lookup
from autotune._families import reset_registry
from autotune._guard import model
from autotune._lab.host import launch
from autotune._ranks import group


def reset_state() -> None:
    """Forget what this process keeps between calls, through each module's own reset: its background calibrations
    (cancelled, waited for), a worker started early that no one took, its job of many processes, the decision memo
    and the stores, side-file changes it could not write and the warnings it gave, families it registered and the
    signatures of their models, ``use_defaults``, the settings it checked, and the budget its fingerprint read
    (environment, affinity, CPU quota, torch's thread count). Tests call it around each test, which runs in a cache
    directory of its own."""
    _background.cancel_all(timeout_s=60)
    _calibrate.reset()
    launch.discard()
    group.leave()
    _answer.forget()
    _config.forget()
    _fingerprint.forget()
    _env.reset()
    lookup.reset()
    demotions.reset()
    documents.reset()
    locks.reset()
    freshness.reset()
    exchange.reset()
    reset_registry()
    model.forget()


__all__ = ["reset_state"]
