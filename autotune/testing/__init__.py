"""Instruments for tests and benchmarks, shipped as ``torch.testing`` is: truth profiles of hardware that is not
here (:mod:`autotune.testing.simulate`) drive the real measurement, search and decision code on a fake clock;
:func:`reset_state` gives each test a process as fresh as a new one."""

from __future__ import annotations

from autotune import _answer, _background, _config, _fingerprint
from autotune._cache import demotions, exchange, lookup
from autotune._families import reset_registry


def reset_state() -> None:
    """Forget what this process keeps between calls: its background calibrations (cancelled, waited for), the
    decision memo and the stores, demotions it could not write, families it registered, ``use_defaults``, and the
    budget its fingerprint read (environment, affinity, CPU quota, torch's thread count).
    Tests call it around each test, which runs in a cache directory of its own."""
    _background.cancel_all(timeout_s=60)
    _answer.forget()
    _config.forget()
    _fingerprint.forget()
    lookup.reset()
    demotions.reset()
    exchange.reset()
    reset_registry()


__all__ = ["reset_state"]
