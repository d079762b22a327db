"""The candidates one family's search holds: set up, set aside when memory is short, released when dropped,
and their results (with the evidence of each drop).

A set-up builds a candidate's model and optimizer and verifies its first steps against the fp32 CPU reference
(the lab does that: real torch in the worker, a truth profile in the simulation). Set-up failures are emitted as
they happen. An out-of-memory error is retried with the failed attempt's memory given back, then *alone*: the
other candidates held on that device, but the fp32 CPU baseline, are set aside and built again when they are
next timed. A device error on an accelerator poisons the session: nothing else is measured in that process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from autotune import _stats, _variants
from autotune._lab.looks import Dropped
from autotune._lab.plan import BASELINE
from autotune._lab.prepare import CandidateFailed, Prepared, classify, unverified
from autotune._lab.protocol import Begin, Checkpoint, Done, Failed, Planned
from autotune._records import Candidate, CandidateResult, Drop, Failure, Interval
from autotune._variants import Facts
from autotune.backends import ClockReading

Emit = Callable[[Planned | Begin | Failed | Checkpoint | Done], None]


class Lab(Protocol):
    #: torch's CPU thread count in the process that times the candidates
    default_threads: int

    def set_up(self, candidate: Candidate) -> Prepared:
        """Build and verify ``candidate``; raise CandidateFailed when it cannot be used."""

    def release(self, candidates: list[Candidate]) -> None:
        """Free what the lab holds for ``candidates`` (no longer timed): memory for the ones still to come."""

    def clock_check(self, device: str) -> str | None:
        """None where :meth:`clock_reading` can say what holds the device's clocks down; otherwise why not."""

    def clock_reading(self, device: str) -> ClockReading | None:
        """The device's clock now and the throttle reasons in force; None where it reports none (the CPU)."""


class Roster:
    """What the session holds: candidates ready to time, their results so far, and whether it can go on."""

    def __init__(self, lab: Lab, emit: Emit, *, discard_on_device_error: bool) -> None:
        self.lab = lab
        self.emit = emit
        self.discard_on_device_error = discard_on_device_error
        self.ready: dict[Candidate, Prepared] = {}
        #: what each candidate's built workload says about its variants (kept while it is set aside)
        self.facts: dict[Candidate, Facts] = {}
        self.results: dict[Candidate, CandidateResult] = {}
        self.reference_failure: Failure | None = None
        self.poisoned = False

    def set_up(self, candidates: list[Candidate], share: tuple[float, float], *,
               again: bool = False) -> list[Candidate]:
        """Build and verify each candidate; returns those ready to time. Failures are emitted as they happen.

        ``again``: candidates measured before (set aside for another one's set-up, or alive in a resumed search):
        their measurements stand (a failure now is added to them), and an out-of-memory error is final (retried
        alone, it would set others aside in turn).
        """
        ready = []
        for index, candidate in enumerate(candidates):
            if self.poisoned:
                break
            fraction = share[0] + (share[1] - share[0]) * index / len(candidates)
            if self._set_up_one(candidate, fraction, again=again):
                ready.append(candidate)
        return ready

    def rebuild(self, candidates: list[Candidate], fraction: float) -> list[Candidate]:
        """Build again those of ``candidates`` not held (set aside for another one's set-up, or alive in a resumed
        search; see ``again`` above); returns those ready, in order. A poisoned roster builds nothing."""
        missing = [c for c in candidates if c not in self.ready]
        if missing and not self.poisoned:
            self.set_up(missing, (fraction, fraction), again=True)
        return [c for c in candidates if c in self.ready]

    def _set_up_one(self, candidate: Candidate, fraction: float, *, again: bool) -> bool:
        """One candidate of :meth:`set_up`; True when it is ready. (Its own frame: no caller's local holds a
        model that an out-of-memory retry alone must free.)"""
        self.emit(Begin(candidate=candidate, phase="setup", fraction=fraction))
        try:
            if self.reference_failure is not None:
                raise CandidateFailed(CandidateResult(candidate=candidate, failure=unverified(self.reference_failure)))
            prepared = self.lab.set_up(candidate) if again else self._set_up(candidate)
        except CandidateFailed as exc:
            result = exc.result
        except Exception as exc:
            result = CandidateResult(candidate=candidate, failure=classify(exc, candidate.device))
        else:
            self.ready[candidate] = prepared
            self.facts[candidate] = prepared.facts
            if not again:
                self.results[candidate] = prepared.result
            return True
        failure = result.failure
        assert failure is not None
        earlier = self.results.get(candidate) if again else None
        if earlier is not None:
            if failure.kind == "oom":
                held = ", ".join(c.label for c in self.ready if c.device == candidate.device) or "nothing"
                failure = Failure(kind="oom", detail=f"{failure.detail} (built again to be timed, next to {held})")
            result = earlier.model_copy(update={"failure": failure})
        self.results[candidate] = result
        self.emit(Failed(result=result))
        if candidate == BASELINE:
            self.reference_failure = failure
        elif (candidate.device != _variants.CPU and self.discard_on_device_error
              and failure.kind not in ("numerics", "too_slow")):
            self.poisoned = True  # a device error can leave the context poisoned: measure nothing else here
        return False

    def _set_up(self, candidate: Candidate) -> Prepared:
        """``lab.set_up``, retried after an out-of-memory error: first with the failed attempt's memory given back
        (the exception's frames hold the failed model until then), then *alone*: every other candidate held on
        that device (but the fp32 CPU baseline, which every decision compares with) set aside and freed too.
        Those set aside are built again when they are next timed: a set-up can peak higher than the timed steps
        (cuDNN's benchmark mode tries algorithms with large workspaces on a layer's first call, once per process).
        """
        held: list[Candidate] = []
        retries: list[str] = []
        for retry in ("", "again after freeing memory", "then alone"):
            if retry == "then alone":
                held = [c for c in self.ready if c.device == candidate.device and c != BASELINE]
                if not held:
                    break  # it was alone already
                for other in held:
                    del self.ready[other]
            if retry:
                self.lab.release([candidate, *held])
                retries.append(retry)
            try:
                return self.lab.set_up(candidate)
            except Exception as exc:
                failure = classify(exc, candidate.device)
                if failure.kind != "oom":
                    raise
        detail = f"{failure.detail} ({len(retries) + 1} attempts: {', '.join(retries)})"
        raise CandidateFailed(CandidateResult(candidate=candidate, failure=Failure(kind="oom", detail=detail)))

    def release(self, dropped: set[Candidate]) -> None:
        """A dropped candidate is never timed again: free its model and optimizer before the next set-ups."""
        if not dropped:
            return
        for candidate in dropped:
            self.ready.pop(candidate, None)
        self.lab.release(sorted(dropped, key=lambda c: c.label))

    def with_baseline_ratios(self) -> list[CandidateResult]:
        """The results, each timed candidate with its step-time ratio to fp32 on the CPU where both were timed
        in the same rounds."""
        baseline = self.results.get(BASELINE)
        out = []
        for candidate, result in self.results.items():
            if (baseline is not None and baseline.timing is not None and result.timing is not None
                    and candidate != BASELINE and result.timing.stage == baseline.timing.stage):
                estimate, low, high = _stats.ratio_interval(result.timing.round_ms, baseline.timing.round_ms)
                vs_baseline = Interval(estimate=estimate, low=low, high=high)
                timing = result.timing.model_copy(update={"vs_baseline": vs_baseline})
                out.append(result.model_copy(update={"timing": timing}))
            else:
                out.append(result)
        return out


def evidence(dropped: Dropped[Candidate] | None) -> Drop | None:
    """A stage's evidence against a candidate (clearly slower, or far behind), as its result records it."""
    if dropped is None:
        return None
    return Drop(by=dropped.by, ratio=Interval(estimate=dropped.estimate, low=dropped.low, high=dropped.high),
                rounds=dropped.rounds, far_behind=dropped.far_behind)


__all__ = ["Emit", "Lab", "Roster", "evidence"]
