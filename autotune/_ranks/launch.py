"""Where this process stands in a job of many processes, from what its launcher set.

torchrun (and ``accelerate launch``, which runs it) exports ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the machine's index); Lightning's own launcher ``LOCAL_RANK``, ``NODE_RANK``
and ``WORLD_SIZE``, with the rank in its default process group. torch-free: a single process (no such variables,
or a world of one) reads a few variables and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from autotune._errors import ConfigurationError

#: what torchrun exports to every process it starts (the job's place in it)
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
#: a machine's index in the job: torchrun's, then Lightning's and SLURM-style launchers'
NODE_VARIABLES = ("GROUP_RANK", "NODE_RANK")


@dataclass(frozen=True)
class Launch:
    """This process in its job, e.g. ``Launch(rank=3, world_size=4, local_rank=1, node="1")``; ``node`` tells the
    machines apart (ranks of one machine share it), ``None`` where no launcher said."""

    rank: int
    world_size: int
    local_rank: int
    node: str | None


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name].strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(name, raw, "a whole number, as torchrun sets it") from None
    if value < 0:
        raise ConfigurationError(name, raw, "a whole number >= 0, as torchrun sets it")
    return value


def _node(environ: Mapping[str, str]) -> str | None:
    return next((environ[name].strip() for name in NODE_VARIABLES if environ.get(name, "").strip()), None)


def from_environment(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The launch torchrun's variables describe (all four set, a world of more than one); None otherwise."""
    environ = os.environ if environ is None else environ
    if not all(environ.get(name, "").strip() for name in TORCHRUN_VARIABLES):
        return None
    world_size = _int(environ, "WORLD_SIZE")
    if world_size < 2:
        return None
    rank, local_rank = _int(environ, "RANK"), _int(environ, "LOCAL_RANK")
    if rank >= world_size:
        raise ConfigurationError("RANK", rank, f"a rank below WORLD_SIZE={world_size}")
    return Launch(rank=rank, world_size=world_size, local_rank=local_rank, node=_node(environ))


def from_group(rank: int, world_size: int, environ: Mapping[str, str] | None = None) -> Launch:
    """The launch of a process in torch.distributed's default group of ``world_size``: its local rank from
    ``LOCAL_RANK`` (else its rank: one machine), its machine from the node variables."""
    environ = os.environ if environ is None else environ
    local_rank = _int(environ, "LOCAL_RANK") if environ.get("LOCAL_RANK", "").strip() else rank
    return Launch(rank=rank, world_size=world_size, local_rank=local_rank, node=_node(environ))


def own_index(local_rank: int, devices: int) -> int:
    """The index of a rank's own device among ``devices`` of one kind on its machine: ``cuda:LOCAL_RANK`` as torchrun,
    Lightning and Accelerate place ranks; 0 where each rank sees only its own device (a launcher that sets
    ``CUDA_VISIBLE_DEVICES`` per rank); ranks beyond the devices share them in turn."""
    return 0 if devices <= 1 else local_rank % devices


__all__ = ["NODE_VARIABLES", "TORCHRUN_VARIABLES", "Launch", "from_environment", "from_group", "own_index"]
