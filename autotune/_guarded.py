"""``autotune.Guard``: the guard, answering again with ``best_config`` where it is made by hand.

``Config.guard()`` hands ``best_config`` to the guard it makes; a guard made by hand gets it here, above the Config,
which the guard's own module sits below."""

from __future__ import annotations

from typing import Any

from autotune._config import Config, best_config
from autotune._guard import watch
from autotune._guard.answer import Answer
from autotune._records import Candidate


class Guard(watch.Guard[Config]):
    """Watches one training run of ``model_kind`` on ``candidate``; made by ``Config.guard()`` (the rules:
    ``autotune._guard.watch``). :meth:`fallback` answers with ``answer``, by default ``autotune.best_config``."""

    def __init__(self, model_kind: str, candidate: Candidate, digest: str, *, answer: Answer[Config] = best_config,
                 **options: Any) -> None:
        super().__init__(model_kind, candidate, digest, answer=answer, **options)


__all__ = ["Guard"]
