"""Which model a demotion is for: a model's signature, and the signature of the model a family builds."""

from __future__ import annotations

import hashlib
import logging

import torch
from torch import nn

from autotune._errors import UnknownFamilyError
from autotune._families import get_family
from autotune._guard.replay import unwrapped

log = logging.getLogger("autotune")


def model_signature(model: nn.Module) -> str:
    """What was trained, e.g. ``'Sequential 5c3e2a09d1f4'``: the model's class and a digest of its parameters' names
    and shapes (through ``torch.compile``'s and DataParallel's wrappers)."""
    model = unwrapped(model)
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(f"{name}:{tuple(parameter.shape)};".encode())
    return f"{type(model).__qualname__} {digest.hexdigest()[:12]}"


#: (build reference, version) -> the signature of the model that family builds (None: it could not be built)
_family_models: dict[tuple[str, str | None], str | None] = {}


def family_model(model_kind: str) -> str | None:
    """The signature of the model ``model_kind``'s family builds (built once per process, on the meta device where
    it can be); None when the family is not registered here or its build fails."""
    try:
        family = get_family(model_kind)
    except UnknownFamilyError:
        return None
    key = (family.ref, family.version)
    if key not in _family_models:
        with torch.random.fork_rng(devices=[]):  # a build that seeds must not move the app's random state
            try:
                with torch.device("meta"):
                    _family_models[key] = model_signature(family.build().model)
            except Exception:  # some builds need real tensors (loaded weights): built as they are
                try:
                    _family_models[key] = model_signature(family.build().model)
                except Exception as exc:  # the app's build: its failure is said, not raised here
                    log.warning("cannot build %s to tell its demotions from other models' (%s: %s)", model_kind,
                                type(exc).__name__, exc)
                    _family_models[key] = None
    return _family_models[key]


def forget() -> None:
    """Forget the signatures of the models families build: a family registered again may build another."""
    _family_models.clear()


__all__ = ["family_model", "forget", "model_signature"]
