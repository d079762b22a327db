"""What a guard answers with after it demotes: ``autotune.best_config``, handed over by ``Config.guard()`` (the guard
sits below the Config it guards and cannot import the function that makes one)."""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import nn
    from typing_extensions import TypeVar

    from autotune._decision import Decision
    from autotune._records import Prefer

    #: what the guard's answer function answers: a Config where ``Config.guard()`` made it; by default (PEP 696,
    #: for type checkers only) a Decision, so that a guard made by hand without one needs no annotation
    Answered = TypeVar("Answered", bound="Decision", covariant=True, default="Decision")
else:
    Answered = typing.TypeVar("Answered", bound="Decision", covariant=True)


class Answer(Protocol[Answered]):
    """``autotune.best_config``: what :meth:`Guard.fallback` answers with (``Config.guard()`` hands it over)."""

    def __call__(self, model_kind: str, *, model: nn.Module | None, prefer: Prefer, expected_steps: int | None,
                 wait: bool) -> Answered: ...


__all__ = ["Answer", "Answered"]
