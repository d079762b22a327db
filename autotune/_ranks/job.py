"""``best_config`` in a job of many processes: one calibration per machine, one answer for the job.

Each machine's first rank measures (through the one miss path: one calibration per machine, the family's lock
keeping other jobs' processes out) and answers for each of its machine's ranks on its own view (``agree.view``);
the others wait in the job's group. First every rank sends what it asked for (the family and every option):
one that differs from the deciding rank's raises on every rank, naming both, before anything is measured. Then,
as collectives every rank runs in the same order:

1. the deciding rank (rank 0's machine's first rank) broadcasts its answer: the job's choice;
2. each machine's first rank sends each of its ranks the choice on that rank's own device (``agree.for_rank``);
3. every rank sends the digest of what it will train with (``agree.digest``); one that differs from the deciding
   rank's raises on every rank, naming both answers.

A failure on any machine (its reference could not be measured, a bug) is sent in its place, so every rank raises
instead of waiting. Everything crosses as JSON of typed records, never pickle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field

from autotune._decision import Decision
from autotune._errors import RanksError
from autotune._ranks.agree import digest, for_rank, words
from autotune._ranks.group import JobGroup
from autotune._records import FamilyResult, Ranks, Record

log = logging.getLogger("autotune")


@dataclass(frozen=True)
class Machine:
    """What a machine's first rank found: each local rank's answer on its own view (``own``), the machine's
    measurements (None: it answered without measuring), its devices of each kind and each process's share of its
    cores (``share``)."""

    own: dict[int, Decision]
    measured: FamilyResult | None
    counts: dict[str, int]
    share: int


class _Choice(Record):
    """The deciding rank's answer, or why it has none."""

    config: Decision | None = None
    error: str | None = None


class _Answers(Record):
    """A machine's answers, one per local rank, or why it has none."""

    configs: dict[int, Decision] = Field(default_factory=dict)
    error: str | None = None


class _Asked(Record):
    """What a rank asked ``best_config`` for: the family and every option that shapes the answer."""

    model_kind: str
    options: dict[str, str]


class _Trains(Record):
    digest: str
    words: str


def agreed(job: JobGroup, model_kind: str, options: dict[str, object],
           machine: Callable[[JobGroup], Machine]) -> Decision:
    """This rank's answer for ``model_kind`` in ``job``, asked with ``options`` (by name, e.g. ``{"prefer":
    "auto"}``), which must be the same on every rank (:func:`asked`): ``machine`` runs on each machine's first rank
    only."""
    key = (model_kind, *options.items())
    known = job.answers.get(key)
    if isinstance(known, Decision):
        return known
    asked(job, model_kind, options)
    found: Machine | None = None
    failure: Exception | None = None
    if job.leads:
        try:
            found = machine(job)
        except Exception as exc:  # sent to the other ranks below, then raised here
            failure = exc
    rank = job.launch.rank
    said = None
    if rank == job.decider:
        said = (_Choice(config=found.own[job.launch.local_rank]) if found is not None
                else _Choice(error=_words(failure)))
    choice = _Choice.model_validate_json(job.broadcast(
        said.model_dump_json() if said is not None else None, root=job.decider, model_kind=model_kind,
        waiting_for=f"rank {job.decider}'s machine to measure {model_kind!r}" if rank != job.decider
        else f"the other ranks to take its answer for {model_kind!r}"))
    answers = None
    if found is not None and choice.config is not None:
        answers = _Answers(configs={
            member.local_rank: for_rank(
                choice.config, found.own[member.local_rank], found.measured, decided_by=job.decider,
                counts=found.counts, share=found.share,
                ranks=Ranks(rank=member.rank, local_rank=member.local_rank, world_size=job.ranks.world_size,
                            local_world_size=job.ranks.local_world_size))
            for member in job.machine})
    elif job.leads:
        answers = _Answers(error=_words(failure) if failure is not None else "no choice to take")
    sent = job.allgather(answers.model_dump_json() if answers is not None else "", model_kind=model_kind,
                         at=f"the answers for {model_kind!r}",
                         waiting_for=f"each machine's first rank to answer {model_kind!r}")
    if failure is not None:
        raise failure
    if choice.config is None:
        raise RanksError(model_kind, f"rank {job.decider}'s machine could not answer: {choice.error}")
    for other, text in enumerate(sent):
        error = _Answers.model_validate_json(text).error if text else None
        if error is not None:
            raise RanksError(model_kind, f"rank {other}'s machine could not answer: {error}")
    config = _Answers.model_validate_json(sent[job.leader]).configs[job.launch.local_rank]
    confirm(job, config)
    log.info("%s, rank %d: %s", model_kind, rank, config.reason)
    job.answers[key] = config
    return config


def asked(job: JobGroup, model_kind: str, options: dict[str, object]) -> None:
    """Check that every rank of ``job`` asks for ``model_kind`` with ``options``; raise :class:`RanksError` on every
    rank, naming both requests, where one differs from the deciding rank's."""
    mine = _Asked(model_kind=model_kind, options={name: repr(value) for name, value in options.items()})
    said = [_Asked.model_validate_json(text) for text in job.allgather(
        mine.model_dump_json(), model_kind=model_kind, at="best_config",
        waiting_for=f"the other ranks to ask for {model_kind!r} too")]
    reference = said[job.decider]
    differs = next((rank for rank, other in enumerate(said) if other != reference), None)
    if differs is None:
        return
    other = said[differs]
    if other.model_kind != reference.model_kind:
        why = f"rank {differs} asked for {other.model_kind!r} but rank {job.decider} for {reference.model_kind!r}"
    else:
        names = [name for name in {**reference.options, **other.options}
                 if other.options.get(name) != reference.options.get(name)]
        why = (f"rank {differs} asked for {other.model_kind!r} with " + ", ".join(
            f"{name}={other.options.get(name)}" for name in names) + f" but rank {job.decider} with " + ", ".join(
            f"{name}={reference.options.get(name)}" for name in names))
    raise RanksError(model_kind, why)


def confirm(job: JobGroup, config: Decision) -> None:
    """Check that every rank of ``job`` trains with what ``config`` sets for the job (``agree.digest``); raise
    :class:`RanksError` on every rank, naming both answers, where one differs from the deciding rank's."""
    trains = [_Trains.model_validate_json(text) for text in job.allgather(
        _Trains(digest=digest(config), words=words(config)).model_dump_json(), model_kind=config.model_kind,
        at=f"the configurations for {config.model_kind!r}",
        waiting_for=f"every rank's answer for {config.model_kind!r}")]
    reference = trains[job.decider]
    differs = next((r for r, t in enumerate(trains) if t.digest != reference.digest), None)
    if differs is not None:
        raise RanksError(config.model_kind, f"rank {differs} would train with {trains[differs].words!r} but rank "
                         f"{job.decider} with {reference.words!r}: DDP needs one configuration on every rank")


def _words(failure: BaseException | None) -> str:
    return f"{type(failure).__name__}: {failure}" if failure is not None else "nothing measured"


__all__ = ["Machine", "agreed", "asked", "confirm"]
