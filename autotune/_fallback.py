"""What a guard answers with after it demotes: ``best_config``, registered by ``autotune._answer`` when it loads.

The guard sits below the Config it guards and cannot import the module that answers; ``best_config`` answered from
the cache loads no guard, so the answer cannot register with the guard's own module either."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import nn

    from autotune._config import Config
    from autotune._records import Prefer


class Answer(Protocol):
    def __call__(self, model_kind: str, *, model: nn.Module | None, prefer: Prefer, expected_steps: int | None,
                 wait: bool) -> Config: ...


_answering: list[Answer] = []


def answer_with(answer: Answer) -> None:
    """Register the function :meth:`Guard.fallback` answers with (``autotune._answer.best_config``)."""
    _answering[:] = [answer]


def answering() -> Answer:
    """The registered answer; ``autotune.Config`` and ``autotune.Guard`` load the module that registers it first."""
    (answer,) = _answering
    return answer


__all__ = ["Answer", "answer_with", "answering"]
