"""Every ``AUTOTUNE_*`` environment variable, declared once, typed, validated at first use (never at import).

An empty value means "unset", so ``AUTOTUNE_CACHE_DIR=`` in a shell script does not point the cache at ``''``.
A background calibration reads them as they were when it started (:func:`snapshot`, :func:`pinned`), not as
they are when its thread gets to each one.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, cast

from autotune._errors import ConfigurationError

if TYPE_CHECKING:
    from autotune._variants import Search

T = TypeVar("T")

Isolation = Literal["subprocess", "inprocess"]
ISOLATIONS: tuple[Isolation, ...] = ("subprocess", "inprocess")
SEARCHES: tuple[Search, ...] = ("precision", "default", "extended")


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: its name, default, parser and what a valid value looks like."""

    name: str
    default: T
    parse: Callable[[str], T]
    expected: str
    doc: str

    def get(self) -> T:
        values = _PINNED.get()
        raw = (values.get(self.name, "") if values is not None else os.environ.get(self.name, "")).strip()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except LookupError as exc:  # a value of the right form that names nothing here: it says what there is
            raise ConfigurationError(self.name, raw, self.expected, why=str(exc.args[0])) from None
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(self.name, raw, self.expected) from exc


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError(raw)
    return value


def _isolation(raw: str) -> Isolation:
    if raw not in ISOLATIONS:
        raise ValueError(raw)
    return raw


def _interpreter(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():  # a value of the right form that names nothing here
        raise LookupError(f"there is no file at {str(path)!r}")
    return path


def _search(raw: str) -> Search:
    if raw not in SEARCHES:
        raise ValueError(raw)
    return raw


@functools.cache
def _device(raw: str) -> str:
    # A device this process can use, in prefer's words too (gpu, a backend); checking needs no device
    # initialisation, and what is usable does not change while a process runs. Imported here: torch-free modules
    # read the other variables.
    from autotune.backends import resolve_device

    return resolve_device(raw)


CACHE_DIR: Knob[Path | None] = Knob(
    "AUTOTUNE_CACHE_DIR", None, lambda raw: Path(raw).expanduser(), "a directory path",
    "where measurements are stored (default: the platform's user cache dir, e.g. ~/.cache/autotune)",
)
DEVICE: Knob[str | None] = Knob(
    "AUTOTUNE_DEVICE", None, _device, "a device this process can use: cpu, gpu, cuda, cuda:1, mps, xpu",
    "force this device for every model kind (gpu: the first usable accelerator; cuda: cuda:0); the Config's "
    "source says 'forced'",
)
ISOLATION: Knob[Isolation] = Knob(
    "AUTOTUNE_ISOLATION", "subprocess", _isolation, "subprocess or inprocess",
    "run candidates in a spawned worker (safe) or in this process (unsafe against native crashes)",
)
CANDIDATE_TIMEOUT_S: Knob[float] = Knob(
    "AUTOTUNE_CANDIDATE_TIMEOUT_S", 120.0, _positive_float, "seconds > 0",
    "a candidate silent for this long is killed and recorded as 'timeout'",
)
LOCK_TIMEOUT_S: Knob[float] = Knob(
    "AUTOTUNE_LOCK_TIMEOUT_S", 600.0, _positive_float, "seconds > 0",
    "how long a process waits for another one's calibration before answering heuristically, and for "
    "another measurement on this machine before measuring alongside it",
)
RANKS_TIMEOUT_S: Knob[float] = Knob(
    "AUTOTUNE_RANKS_TIMEOUT_S", 1800.0, _positive_float, "seconds > 0",
    "in a job of many processes, how long a rank waits for the others where the wait may cover a calibration "
    "(best_config: a machine's calibration, rank 0's answer) before it raises, naming the rank it waited for",
)
RANKS_LOOP_TIMEOUT_S: Knob[float] = Knob(
    "AUTOTUNE_RANKS_LOOP_TIMEOUT_S", 300.0, _positive_float, "seconds > 0",
    "in a job of many processes, how long a rank waits for the others inside the training loop (the guard's "
    "reads and replay, guard.fallback) before it raises, naming what it waited for",
)
WORKER_PYTHON: Knob[Path | None] = Knob(
    "AUTOTUNE_WORKER_PYTHON", None, _interpreter, "the path of a Python interpreter that can import autotune and torch",
    "the interpreter the calibration worker runs on, for an app whose sys.executable is no Python (an embedded "
    "interpreter); frozen apps start the worker through their own executable (autotune.freeze_support)",
)
BUDGET_S: Knob[float] = Knob(
    "AUTOTUNE_BUDGET_S", 8.0, _positive_float, "seconds > 0",
    "timing budget per model kind, after set-up and verification",
)

SEARCH: Knob[Search] = Knob(
    "AUTOTUNE_SEARCH", "default", _search, "precision, default or extended",
    "precision: device x precision only; default: also memory format, optimizer and CPU threads; "
    "extended: also torch.compile (tens of seconds per candidate)",
)
DEFAULTS: Knob[Path | None] = Knob(
    "AUTOTUNE_DEFAULTS", None, lambda raw: Path(raw).expanduser(), "a file path",
    "a results file shipped with the app (python -m autotune --export): read-only, under the user's cache; "
    "local measurements always win",
)

KNOBS: tuple[Knob[object], ...] = cast(
    "tuple[Knob[object], ...]",
    (CACHE_DIR, DEVICE, ISOLATION, WORKER_PYTHON, CANDIDATE_TIMEOUT_S, LOCK_TIMEOUT_S, RANKS_TIMEOUT_S,
     RANKS_LOOP_TIMEOUT_S, BUDGET_S, SEARCH, DEFAULTS),
)

#: the settings a context reads instead of the environment (a background job's thread: those at its start)
_PINNED: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("autotune_pinned", default=None)


def snapshot() -> dict[str, str]:
    """Every ``AUTOTUNE_*`` setting as it is now (in this context: pinned ones stay pinned), for :func:`pinned`."""
    values = _PINNED.get()
    return {knob.name: (values if values is not None else os.environ).get(knob.name, "") for knob in KNOBS}


#: the settings :func:`check_all` found valid
_checked: set[tuple[str, ...]] = set()


def check_all() -> None:
    """Read every setting now: an invalid one raises :class:`ConfigurationError` at once, even one only a
    measurement would read (an answer from the cache reads few of them). Once per set of values."""
    values = tuple(snapshot().values())
    if values not in _checked:
        for knob in KNOBS:
            knob.get()
        _checked.add(values)


def measured_for() -> tuple[object, ...]:
    """The parsed values of the settings that change what a calibration measures (``8`` and ``8.0`` are one
    budget): device, budget, search, shipped defaults. Raises :class:`ConfigurationError` for an invalid one."""
    return tuple(knob.get() for knob in (DEVICE, BUDGET_S, SEARCH, DEFAULTS))


@contextlib.contextmanager
def pinned(values: Mapping[str, str]) -> Iterator[None]:
    """Within this block (and this thread), read the settings from ``values`` rather than the environment."""
    token = _PINNED.set(values)
    try:
        yield
    finally:
        _PINNED.reset(token)


def reset() -> None:
    """Forget the settings :func:`check_all` found valid and the devices ``AUTOTUNE_DEVICE`` named: read afresh."""
    _checked.clear()
    _device.cache_clear()


__all__ = ["ISOLATIONS", "KNOBS", "SEARCHES", "Isolation", "Knob", "Search", "check_all", "measured_for", "pinned",
           "reset", "snapshot"]
