"""The job's own gloo group: where the ranks wait for each other and exchange JSON, never pickle.

Created once per process, the first time a rank asks (every rank must, in the same order: each exchange is a
collective). Under a launcher that exported torchrun's variables it is built like ``init_process_group("env://")``
builds its store (torchrun's agent store, or rank 0's), under a prefix of its own, whether or not the app has
initialised its default group yet; otherwise, in a default group of more than one, it is a new gloo group of it.
Its timeout is ``AUTOTUNE_RANKS_TIMEOUT_S`` (long: a machine's calibration can take minutes), not the job's own,
so an NCCL watchdog never fires while a machine calibrates, and a rank that dies or hangs leaves the others a
:class:`~autotune._errors.RanksError` naming it, within that timeout, never a hang. Lightning's and Accelerate's
one-time work per node waits the same way (a gloo group with a timeout of its own). A wait inside the training
loop (the guard's reads, its replay, ``guard.fallback()``) covers no calibration: it waits at most
``AUTOTUNE_RANKS_LOOP_TIMEOUT_S`` (``in_loop``). Each rank's part of an allgather names the exchange it is for
(``at``): ranks at different exchanges raise, naming both, instead of reading each other's payloads.
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions
from torch.distributed.distributed_c10d import PrefixStore
from torch.distributed.rendezvous import rendezvous

from autotune import _env
from autotune._errors import RanksError
from autotune._ranks.launch import Launch, from_environment, from_group
from autotune._records import Ranks, Record
from autotune._version import __version__

log = logging.getLogger("autotune")



class Group(Protocol):
    """A gloo group's collectives: a new group of the default one, or a ``ProcessGroupGloo`` on its store."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: AllgatherOptions) -> dist.Work: ...


@dataclass(frozen=True)
class Member:
    """One rank as the roster lists it: its machine and its local rank there."""

    rank: int
    node: str
    local_rank: int


class JobGroup:
    """This process's place in the job (``ranks``), its machine's ranks, and the collectives between them.

    ``answers`` holds the answers agreed so far (every rank keeps the same ones, so every rank asks again at the
    same time: after a job-wide demotion, :meth:`forget`). ``timeout_s`` bounds the waits that may cover a
    calibration, ``loop_timeout_s`` those inside the training loop (``in_loop``)."""

    def __init__(self, launch: Launch, group: Group, timeout_s: float, *, loop_timeout_s: float) -> None:
        self.launch = launch
        self.group = group
        self.timeout_s = timeout_s
        self.loop_timeout_s = loop_timeout_s
        self.answers: dict[tuple[object, ...], object] = {}
        roster = [_Joined.model_validate_json(text) for text in self.allgather(
            _Joined(node=launch.node, local_rank=launch.local_rank, version=__version__).model_dump_json(),
            at="joining", waiting_for="the other ranks to join")]
        members = [_member(rank, joined) for rank, joined in enumerate(roster)]
        if len({joined.version for joined in roster}) > 1:
            raise RanksError(None, "the ranks run different autotune versions (" + ", ".join(
                f"rank {rank}: {joined.version}" for rank, joined in enumerate(roster)) + ")")
        me = members[launch.rank]
        #: the ranks on this machine, by local rank
        self.machine = sorted((m for m in members if m.node == me.node), key=lambda m: m.local_rank)
        if len({m.local_rank for m in self.machine}) < len(self.machine):
            raise RanksError(None, f"ranks {', '.join(str(m.rank) for m in self.machine)} share one machine and "
                             "local ranks; set LOCAL_RANK and GROUP_RANK (or NODE_RANK) as torchrun does")
        #: each machine's first rank: it measures for the machine, the others wait
        self.leaders = {node: min((m for m in members if m.node == node), key=lambda m: m.local_rank).rank
                        for node in dict.fromkeys(m.node for m in members)}
        self.leader = self.leaders[me.node]
        #: the rank whose machine chooses for the whole job: rank 0's machine's first rank
        self.decider = self.leaders[members[0].node]
        self.ranks = Ranks(rank=launch.rank, local_rank=launch.local_rank, world_size=launch.world_size,
                           local_world_size=len(self.machine))

    @property
    def leads(self) -> bool:
        """This rank measures for its machine."""
        return self.leader == self.launch.rank

    def forget(self, model_kind: str) -> None:
        """Forget the answers agreed for ``model_kind`` (on every rank at once: the next asks agree again)."""
        for key in [key for key in self.answers if key[0] == model_kind]:
            del self.answers[key]

    def first(self, found: str | None, *, at: str, waiting_for: str, in_loop: bool = False) -> tuple[int, str] | None:
        """The lowest rank that ``found`` something, and what: every rank learns the same."""
        said: Sequence[str] = self.allgather(found or "", at=at, waiting_for=waiting_for, in_loop=in_loop)
        return next(((rank, text) for rank, text in enumerate(said) if text), None)

    def broadcast(self, text: str | None, *, root: int, waiting_for: str, model_kind: str | None = None,
                  in_loop: bool = False) -> str:
        """``root``'s ``text`` on every rank (``text`` is read on ``root`` only)."""
        data = (text or "").encode() if self.launch.rank == root else b""
        length = torch.tensor([len(data)], dtype=torch.int64)
        options = dist.BroadcastOptions()
        options.rootRank = root
        options.timeout = self._timeout(in_loop)
        self._wait(lambda: self.group.broadcast([length], options), waiting_for, model_kind, in_loop)
        payload = _bytes_tensor(data) if self.launch.rank == root else torch.empty(int(length), dtype=torch.uint8)
        if int(length):
            self._wait(lambda: self.group.broadcast([payload], options), waiting_for, model_kind, in_loop)
        return bytes(payload.tolist()).decode()

    def allgather(self, text: str, *, at: str, waiting_for: str, model_kind: str | None = None,
                  in_loop: bool = False) -> list[str]:
        """Every rank's ``text``, by rank, sent for the exchange ``at`` names (e.g. ``"guard.fallback()"``): a rank
        at another one raises :class:`RanksError` on every rank, naming both."""
        data = f"{at}\n{text}".encode()
        size = self.launch.world_size
        options = AllgatherOptions()
        options.timeout = self._timeout(in_loop)
        lengths = [torch.empty(1, dtype=torch.int64) for _ in range(size)]
        self._wait(lambda: self.group.allgather([lengths], [torch.tensor([len(data)], dtype=torch.int64)], options),
                   waiting_for, model_kind, in_loop)
        longest = max(int(length) for length in lengths)
        padded = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[:len(data)] = _bytes_tensor(data)
        self._wait(lambda: self.group.allgather([padded], [mine], options), waiting_for, model_kind, in_loop)
        said = [bytes(p[:int(n)].tolist()).decode().partition("\n") for p, n in zip(padded, lengths, strict=True)]
        other = next((rank for rank, (where, _, _) in enumerate(said) if where != at), None)
        if other is not None and not said[other][1]:
            raise RanksError(model_kind, f"rank {other} runs an autotune that does not name its exchanges (an older "
                             f"one than rank {self.launch.rank}'s {__version__}): install one version on every rank")
        if other is not None:
            raise RanksError(model_kind, f"rank {other} was at {said[other][0]} while rank {self.launch.rank} was at "
                             f"{at}: every rank must make autotune's calls in a job (best_config, guard.step, "
                             "guard.fallback) alike, in the same order")
        return [payload for _, _, payload in said]

    def _timeout(self, in_loop: bool) -> dt.timedelta:
        return dt.timedelta(seconds=self.loop_timeout_s if in_loop else self.timeout_s)

    def _wait(self, start: Callable[[], dist.Work], waiting_for: str, model_kind: str | None, in_loop: bool) -> None:
        try:
            start().wait()
        except RuntimeError as exc:  # DistBackendError and gloo's errors: a peer gone, or the timeout
            detail = _detail(exc)
            knob = _env.RANKS_LOOP_TIMEOUT_S if in_loop else _env.RANKS_TIMEOUT_S
            raise RanksError(model_kind, f"rank {self.launch.rank} waited for {waiting_for} (at most "
                             f"{knob.name}={self._timeout(in_loop).total_seconds():g} s) and got: {detail}") from None


def _detail(exc: BaseException) -> str:
    """The first line of a backend's error, without gloo's source location, e.g. 'Connection closed by peer
    [127.0.0.1]:5518. This is typically caused by a remote worker crashing. ...'."""
    text = str(exc).strip()
    line = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]) if text else type(exc).__name__
    return line[:300]


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class _Joined(Record):
    """What a rank says of itself when it joins: its machine (None: its launcher did not say), its local rank there,
    its autotune."""

    node: str | None
    local_rank: int
    version: str


def _member(rank: int, joined: _Joined) -> Member:
    # No machine index from the launcher: ranks are numbered machine by machine, as launchers do.
    node = joined.node if joined.node is not None else f"first rank {rank - joined.local_rank}"
    return Member(rank=rank, node=node, local_rank=joined.local_rank)


#: this process's job, once joined
_joined: list[JobGroup] = []


def joined(*, required: bool = False) -> JobGroup | None:
    """This process's job, joined on first use: None for a single process (no launcher's variables, no default group
    of more than one) unless ``required`` (then a :class:`RanksError` says what is missing)."""
    if _joined:
        return _joined[0]
    launch = from_environment()
    in_group = launch is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    timeout_s = _env.RANKS_TIMEOUT_S.get() if launch is not None or in_group else 0.0
    timeout = dt.timedelta(seconds=timeout_s)
    if launch is not None:
        group = _from_environment(launch, timeout)
    elif in_group:
        launch = from_group(dist.get_rank(), dist.get_world_size())
        group = cast(Group, dist.new_group(backend="gloo", timeout=timeout))
    elif required:
        raise RanksError(None, "this process is in no job: no launcher set " + ", ".join(
            ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")) + " and torch.distributed has no default "
            "group of more than one process")
    else:
        return None
    job = JobGroup(launch, group, timeout_s, loop_timeout_s=_env.RANKS_LOOP_TIMEOUT_S.get())
    log.info("rank %d of %d (local rank %d of %d): one answer for the job, decided by rank %d's machine",
             job.ranks.rank, job.ranks.world_size, job.ranks.local_rank, job.ranks.local_world_size, job.decider)
    _joined.append(job)
    return job


def _from_environment(launch: Launch, timeout: dt.timedelta) -> Group:
    """The job's gloo group, from the store ``init_process_group("env://")`` uses (MASTER_ADDR, MASTER_PORT)."""
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        store, _, _ = next(rendezvous("env://", rank=launch.rank, world_size=launch.world_size,
                                           timeout=timeout))
        # A prefix of our own in a store the app's groups share; a restarted job's attempt starts afresh.
        prefix = f"autotune/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        return cast(Group, dist.ProcessGroupGloo(PrefixStore(prefix, store), launch.rank, launch.world_size, timeout))
    except (RuntimeError, ValueError) as exc:
        detail = _detail(exc)
        raise RanksError(None, f"rank {launch.rank} could not reach the other ranks through {where} within "
                         f"AUTOTUNE_RANKS_TIMEOUT_S={timeout.total_seconds():g} s: {detail[:300]}") from None


def leave() -> None:
    """Forget this process's job (a test's next job is another)."""
    _joined.clear()


# Released while the interpreter still runs: a gloo group left to the interpreter's final teardown can abort the
# process as it exits ("terminate called without an active exception").
atexit.register(leave)


__all__ = ["JobGroup", "Member", "joined", "leave"]
