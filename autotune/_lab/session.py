"""One family's search: set-up, pruning stages, and the final paired comparison that decisions use.

Stage 1 times every device x precision, stage 2 each device leader's layout and optimizer variants, stage 3 the
combinations that helped, fewer CPU threads and the settings of the leader's precision in each simpler precision
still alive unless an interval shows they do not pay (``plan.variants``, ``Session._donors``). Stages only prune;
every live candidate is then timed again, together, in fresh rounds (stage ``FINAL_STAGE``), and decisions compare
only those: a slowdown between stages cannot become a verdict. Each pruning stage ends with a :class:`Checkpoint`
that a worker restarted after a crash goes on from. The lab, the clock, the control workload and the operating
system's view (``Watch``) are injected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune import _rules, _stats, _variants
from autotune._lab.clocks import throttle_slowdown
from autotune._lab.measure import (
    Clock,
    Comparisons,
    MeasureSettings,
    Runnable,
    Unwatched,
    Watch,
    interleave,
    noise,
    ratio_known,
    warm_up,
)
from autotune._lab.plan import BASELINE, variants
from autotune._lab.protocol import Begin, CalibrationSettings, Checkpoint, Done, Planned
from autotune._lab.roster import Emit, Lab, Roster, evidence
from autotune._records import (
    Candidate,
    CandidateResult,
    ClockEvent,
    Drop,
    Interval,
    MachineLoad,
    NoiseCause,
    Timing,
)

FINAL_STAGE = 4


def _device(candidate: Candidate) -> str:
    return candidate.device


class Session:
    """One pass over a family: candidates set up once, timed in stages, then in the final comparison."""

    def __init__(self, lab: Lab, settings: CalibrationSettings, emit: Emit, *, clock: Clock, control: Runnable,
                 settle: Callable[[float], None], discard_on_device_error: bool, watch: Watch | None = None) -> None:
        self.lab = lab
        self.settings = settings
        self.emit = emit
        self.clock = clock
        self.control = control
        self.settle = settle
        self.watch = watch or Unwatched()
        self.roster = Roster(lab, emit, discard_on_device_error=discard_on_device_error)
        self.control_ms: list[float] = []
        #: what the operating system saw during each timing window, in order
        self.loads: list[MachineLoad] = []
        self.host_wait_s = 0.0
        self.notes: list[str] = []
        #: the budget the stages spent, in the unit the budget counts (``Interleaved.elapsed_s``): the final
        #: comparison gets what is left
        self.timing_s = 0.0
        #: the final comparison ended with a gap beyond the margin unresolved: the result is not final (noisy)
        self.unresolved_gap = False
        #: a device throttled during the final comparison and a candidate's times there moved: not its steady
        #: speed (noisy)
        self.throttled = False
        #: whether each accelerator's throttle reasons are read (``Lab.clock_check``); said once in the notes
        self.clock_checked: dict[str, bool] = {}
        self._last_stage = 1
        #: when the search began, and the final comparison's pick (the headline's subject)
        self.started = clock()
        self.pick: Candidate | None = None
        self.excluded: set[Candidate] = set()
        #: devices far behind another one, with the evidence: it stays with the device when a later stage
        #: refines it on its own (a layout or thread-count variant does not close a 4x gap)
        self.behind: dict[str, Drop] = {}

    def run(self, candidates: list[Candidate], *, staged: bool, backend_notes: dict[str, str],
            failed: Sequence[CandidateResult] = (), resume: Checkpoint | None = None) -> None:
        """Measure ``candidates`` (and, when ``staged``, their variants); emit Done unless poisoned.

        ``failed``: what an earlier worker of this family found failing; neither set up nor proposed again.
        ``resume``: the last stage an earlier worker of this family finished; the search goes on from there.
        """
        self.excluded = {r.candidate for r in failed}
        if resume is not None and self.excluded & set(resume.alive):
            # Its measurements pruned others: the evidence against them no longer stands.
            lost = ", ".join(c.label for c in resume.alive if c in self.excluded)
            self.notes.append(f"searched again from the start in a restarted worker: {lost} failed after stage "
                              f"{resume.stage}, where the search still built on it")
            resume = None
        candidates = [c for c in candidates if c not in self.excluded]
        stages = self._last_stage = 3 if staged and self.settings.search != "precision" else 1
        span = 0.8 / stages  # progress: the stages share 80%, the final comparison the rest
        if resume is None:
            self.emit(Planned(candidates=candidates, stage=1, backend_notes=backend_notes))
            ready = self.roster.set_up(candidates, (0.0, 0.5 * span))
            alive = self._time(ready, 1, (0.5 * span, span))
            self.roster.release(set(ready) - set(alive) - {BASELINE})  # the headline's reference: cheap to hold
            self._checkpoint(1, alive)
        else:
            alive = self._resume(resume, resume.stage * span)
        for stage in range(resume.stage + 1 if resume is not None else 2, stages + 1):
            if self.roster.poisoned:
                return
            new = self._variants(alive, stage)
            if new:
                alive = self._refine(alive, new, stage, span)
            self._checkpoint(stage, alive)
        if self.roster.poisoned:
            return
        self._final(alive)
        if self.pick is not None and not self.roster.poisoned:
            self._headline(self.pick)
        baseline = self.roster.results.get(BASELINE)
        if baseline is not None and baseline.timing is not None and baseline.timing.dropped is not None:
            self.roster.release({BASELINE})
        if self.roster.poisoned:
            return
        # The control judged over every stage's rounds together: a shift between stages counts too.
        causes = noise(self.control_ms, self.loads, self.settings.measure)
        own: tuple[tuple[bool, NoiseCause], ...] = ((self.unresolved_gap, "open_gap"), (self.throttled, "throttled"))
        causes += [cause for flag, cause in own if flag]
        self.emit(Done(
            results=self.roster.with_baseline_ratios(), control_ms=self.control_ms, search_notes=self.notes,
            noisy=bool(causes), noisy_because=causes, loads=self.loads, host_wait_s=self.host_wait_s,
            control_shift=round(_stats.level_shift(self.control_ms)[0], 4) if len(self.control_ms) >= 3 else None,
        ))

    def _refine(self, alive: list[Candidate], new: list[Candidate], stage: int, span: float) -> list[Candidate]:
        """Set up a later stage's variants and time each device's against its leader; the candidates alive after."""
        lo = (stage - 1) * span
        self.emit(Planned(candidates=new, stage=stage))
        # What each device's variants are timed against is built first (held since the stage before, except in a
        # resumed worker): a variant that does not fit next to it sets it aside, not the reverse.
        bases = []
        for device in dict.fromkeys(c.device for c in new):
            leader = self._leader(alive, device)
            bases += [leader, *self._rivals(alive, leader, stage)]
        self.roster.rebuild(bases, lo)
        tried = self.roster.set_up(new, (lo, lo + 0.5 * span))
        devices = list(dict.fromkeys(c.device for c in tried))
        # Each device on its own (its pairs are within the device), sharing the stage's budget: a device
        # far behind another is refined too, so a user who prefers it gets its best configuration.
        for index, device in enumerate(devices):
            leader = self._leader(alive, device)
            rivals = self._rivals(alive, leader, stage)
            group = [leader, *rivals, *(c for c in tried if c.device == device)]
            self.notes.append(f"stage {stage}: " + ", ".join(c.label for c in group[1 + len(rivals):])
                              + " against " + ", ".join(c.label for c in [leader, *rivals]))
            part = tuple(lo + 0.5 * span * (1 + (index + k) / len(devices)) for k in (0, 1))
            timed = self._time(group, stage, (part[0], part[1]), budget_share=1 / len(devices))
            dropped = {c for c in group if c not in timed}
            alive = [c for c in alive if c not in dropped]
            alive += [c for c in group if c not in dropped and c not in alive]
            self.roster.release(dropped - {BASELINE})
        return alive

    def _checkpoint(self, stage: int, alive: list[Candidate]) -> None:
        """Tell the host where the search stands after ``stage``: a restarted worker resumes from here."""
        if not self.roster.poisoned:
            self.emit(Checkpoint(stage=stage, alive=alive, facts=[(c, self.roster.facts[c]) for c in alive],
                                 results=list(self.roster.results.values()), behind=self.behind,
                                 notes=self.notes, control_ms=self.control_ms, loads=self.loads,
                                 timing_s=self.timing_s))

    def _resume(self, checkpoint: Checkpoint, fraction: float) -> list[Candidate]:
        """Take over an earlier worker's search after ``checkpoint.stage``; returns the candidates alive.

        Its measurements stand. Only the fp32 baseline is set up now (its trajectory verifies every later
        set-up; freed again when it is not alive): the others are built again when they are next timed, so the
        memory they need is taken one stage at a time, as in the worker that crashed.
        """
        self.roster.results.update({r.candidate: r for r in checkpoint.results if r.candidate not in self.excluded})
        self.roster.facts.update(dict(checkpoint.facts))
        self.behind.update(checkpoint.behind)
        self.notes += [*checkpoint.notes, f"resumed after stage {checkpoint.stage} in a restarted worker"]
        self.control_ms += checkpoint.control_ms
        self.loads += checkpoint.loads
        self.timing_s = checkpoint.timing_s
        ready = self.roster.rebuild([BASELINE], fraction) if BASELINE not in self.excluded else []
        self.roster.release({c for c in ready if c not in checkpoint.alive})
        return list(checkpoint.alive)

    def _stage_settings(self, stage: int, budget_share: float = 1.0) -> MeasureSettings:
        measure = self.settings.measure
        if stage == FINAL_STAGE:
            # Finalists survived the stages: a single round this far behind is interference, not evidence.
            budget = max(measure.budget_s - self.timing_s, self.settings.final_share * measure.budget_s)
            return measure.model_copy(update={"budget_s": budget, "far_behind": float("inf"),
                                              "far_behind_device": float("inf"), "order_seed": stage})
        rounds = max(look for look in _stats.LOOKS if look <= self.settings.prune_max_rounds)
        return measure.model_copy(update={
            "budget_s": self.settings.stage_shares[stage - 1] * measure.budget_s * budget_share,
            "max_rounds": min(measure.max_rounds, rounds), "order_seed": stage,  # each stage its own orders
        })

    def _time(self, candidates: list[Candidate], stage: int, share: tuple[float, float], *,
              budget_share: float = 1.0) -> list[Candidate]:
        """Interleave ``candidates``, record their timings (replacing earlier ones); those not dropped.

        Candidates not held (set aside for another one's set-up, or alive in a resumed search) are built again
        first; one that fails then is not timed. A poisoned session times nothing.
        """
        candidates = self.roster.rebuild(candidates, share[0])
        if not candidates or self.roster.poisoned:
            return []
        settings = self._stage_settings(stage, budget_share)
        final = stage == FINAL_STAGE

        earlier = {c: self._rounds(c) for c in candidates}
        clocks: dict[Candidate, list[float]] = {c: [] for c in candidates}
        events: dict[Candidate, list[list[ClockEvent]]] = {c: [] for c in candidates}
        checked = {device for device in dict.fromkeys(c.device for c in candidates) if self._clock_check(device)}

        def on_round(round_index: int, key: Candidate | None) -> None:
            if key is not None:  # rounds or budget, whichever runs out first
                done = max(round_index / settings.max_rounds, (self.clock() - started) / settings.budget_s)
                fraction = share[0] + (share[1] - share[0]) * min(1.0, done)
                self.emit(Begin(candidate=key, phase="timing", fraction=fraction))

        def sampled(key: Candidate) -> None:
            """Right after its steps: the device's clock and throttle reasons, still those of its steps."""
            if key.device in checked:
                reading = self.lab.clock_reading(key.device)
                events[key].append(reading.events if reading is not None else [])
                if reading is not None and reading.mhz is not None:
                    clocks[key].append(reading.mhz)

        self.host_wait_s += self.watch.wait_for_host()  # the host's start-up is not the machine the user has
        warm = {c: warm_up(self.roster.ready[c].step, self.clock, self.roster.ready[c].recent_s, settings,
                           steady_s=self._steady_s(c)) for c in candidates}
        estimates = {c: _stats.median(times[-3:]) for c, times in warm.items()}
        self._describe([c for c in candidates if self.roster.ready[c].step.asynchronous])
        started = self.clock()
        timed = interleave(
            {c: self.roster.ready[c].step for c in candidates}, estimate_s=estimates, control=self.control,
            clock=self.clock, settings=settings, on_round=on_round, settle=self.settle, sampled=sampled,
            comparisons=Comparisons(group=_device, margin=_rules.margin, tie_winner=_rules.tie_winner,
                                    across_groups=final, indifference=_rules.indifference),
            watch=self.watch,
        )
        self.control_ms += timed.control_ms
        if final:
            self.pick = timed.pick
        if timed.load is not None:
            self.loads.append(timed.load.model_copy(update={"stage": stage}))
        self.timing_s += timed.elapsed_s
        if timed.unresolved_gap:  # not final: the next calibrate() measures it again
            self.unresolved_gap = True
        for pick, other in timed.open_pairs:
            self.notes.append(f"final comparison: {pick.label} against {other.label}, a pair the pick rests on, "
                              f"was still open after {timed.rounds} rounds (a close call or a busy machine)"
                              + ("; measured again by the next calibration" if timed.unresolved_gap else ""))
        if final:
            for candidate, series in timed.series.items():
                self._throttled(candidate, series.round_ms, events[candidate], earlier[candidate],
                                settings.throttle_slowdown)
        for candidate, series in timed.series.items():
            behind = evidence(series.outpaced)
            if behind is not None:
                self.behind.setdefault(candidate.device, behind)
        for candidate, series in timed.series.items():
            timing = Timing(
                round_ms=series.round_ms, steps_per_round=series.steps_per_round,
                median_ms=_stats.median(series.round_ms), spread=_stats.spread(series.round_ms),
                stage=stage, final=final, dropped=evidence(series.dropped),
                outpaced=evidence(series.outpaced) or self.behind.get(candidate.device), clock_mhz=clocks[candidate],
                clock_events=events[candidate],
            )
            self.roster.results[candidate] = self.roster.results[candidate].model_copy(update={"timing": timing})
        return [c for c in candidates if timed.series[c].dropped is None]

    def _final(self, alive: list[Candidate]) -> None:
        """Time the finalists together; a lone finalist keeps its stage timing, marked final.

        An outpaced candidate (far behind another device) is no finalist: its evidence decides the device
        choice, and it stays its own device's answer for a user who prefers that device.
        """
        alive = [c for c in alive if not self._outpaced(c)]
        if len(alive) > 1:
            self._time(alive, FINAL_STAGE, (0.8, 1.0))
            return
        self.pick = alive[0] if alive else None
        for candidate in alive:
            timing = self.roster.results[candidate].timing
            if timing is not None:
                self.roster.results[candidate] = self.roster.results[candidate].model_copy(
                    update={"timing": timing.model_copy(update={"final": True})})

    def _headline(self, pick: Candidate) -> None:
        """Time ``pick`` against plain fp32 on its device, dropped before the final comparison after a few rounds,
        until their ratio is known within ``_rules.HEADLINE_ERROR`` (a 95% interval), so the first figure a user
        reads is an estimate, not the low end of a chain of intervals: fp32's evidence becomes that ratio. Only where it
        costs at most ``_rules.HEADLINE_COST`` x the calibration's time so far (its set-up where it is not held:
        fp32 on the CPU is, its warm-up and rounds), and on an accelerator only where both are still held; else the
        notes say the headline stays a bound."""
        reference = Candidate(device=pick.device, precision=_variants.FP32.name)
        result = self.roster.results.get(reference)
        if result is None or result.timing is None or result.timing.dropped is None or reference == pick:
            return
        stopped = result.timing.dropped
        if stopped.by == pick and _rules.known((stopped.ratio.estimate, stopped.ratio.low, stopped.ratio.high)):
            return
        started = self.clock()
        cap_s = _rules.HEADLINE_COST * (started - self.started)
        series = None
        # Built again on the CPU only: on an accelerator a build beside the pick could run out of its memory, and
        # fail a candidate (or poison the device) that the search had timed and dropped cleanly.
        held = all(c in self.roster.ready for c in (reference, pick)) or (
            pick.device == _variants.CPU and (result.setup_s or 0.0) < cap_s)
        if held and self.roster.rebuild([reference, pick], 1.0) == [reference, pick]:
            settings = self._stage_settings(FINAL_STAGE).model_copy(update={"order_seed": FINAL_STAGE + 1})
            warm = {c: warm_up(self.roster.ready[c].step, self.clock, self.roster.ready[c].recent_s, settings,
                               steady_s=self._steady_s(c)) for c in (reference, pick)}
            series = ratio_known({c: self.roster.ready[c].step for c in (reference, pick)},
                                 estimate_s={c: _stats.median(times[-3:]) for c, times in warm.items()},
                                 clock=self.clock, settings=settings, error=_rules.HEADLINE_ERROR,
                                 alpha=_rules.HEADLINE_ALPHA, cap_s=cap_s - (self.clock() - started))
        self.roster.release({reference} - {BASELINE})
        estimate, low, high = (_stats.ratio_interval(series[reference].round_ms, series[pick].round_ms,
                                                     alpha=_rules.HEADLINE_ALPHA)
                               if series is not None else (0.0, 0.0, 0.0))
        if series is None or low <= 1 + _rules.margin(reference, pick):
            why = (f"which would cost more than {_rules.HEADLINE_COST:.0%} of the calibration's time" if held or
                   pick.device == _variants.CPU else f"{reference.label} no longer held (built again beside the "
                   "pick, it could run out of the device's memory)")
            self.notes.append(f"{reference.label} against {pick.label}: their ratio not timed to within "
                              f"{_rules.HEADLINE_ERROR:.0%}, {why}; the headline is a bound")
            return
        drop = Drop(by=pick, ratio=Interval(estimate=estimate, low=low, high=high),
                    rounds=len(series[pick].round_ms), far_behind=False)
        self.roster.results[reference] = result.model_copy(
            update={"timing": result.timing.model_copy(update={"dropped": drop})})

    def _leader(self, alive: list[Candidate], device: str) -> Candidate:
        """The fastest live candidate on ``device`` among those timed last (it proposes the next variants), on
        paired estimates: timings of different stages are not compared."""
        on_device = [c for c in alive if c.device == device]
        latest = max(self._stage(c) for c in on_device)
        timed = [c for c in on_device if self._stage(c) == latest]
        scores = _stats.paired_scores({c: self._rounds(c) for c in timed})
        return min(timed, key=lambda c: scores[c] if self._rounds(c) else float("inf"))

    def _stage(self, candidate: Candidate) -> int:
        timing = self.roster.results[candidate].timing
        return timing.stage if timing is not None else 0

    def _outpaced(self, candidate: Candidate) -> bool:
        return candidate.device in self.behind

    def _clock_check(self, device: str) -> bool:
        """Whether ``device``'s throttle reasons are read; the notes say so, or why not, once per accelerator."""
        if device not in self.clock_checked:
            why_not = self.lab.clock_check(device)
            self.clock_checked[device] = why_not is None
            if device != _variants.CPU:
                self.notes.append(f"{device} clock check: " + ("throttle reasons read after each candidate's timed "
                                                               "steps" if why_not is None else f"off, {why_not}"))
        return self.clock_checked[device]

    def _throttled(self, candidate: Candidate, round_ms: list[float], events: list[list[ClockEvent]],
                   earlier_ms: list[float], limit: float) -> None:
        """A candidate whose rounds ran more than ``limit`` slower while its device reported a throttle reason
        in the final comparison (``clocks.throttle_slowdown``): its ratios there are not its speed, and the CPU
        control cannot see it. Noisy."""
        found = throttle_slowdown(round_ms, events, earlier_ms, limit)
        if found is not None:
            slowdown, reasons = found
            self.throttled = True
            self.notes.append(f"final comparison: {candidate.device} reported {' and '.join(reasons)} while "
                              f"{candidate.label} ran, {slowdown:.0%} slower than in its other rounds; measured "
                              "again by the next calibration")

    def _describe(self, asynchronous: list[Candidate]) -> None:
        """Say once per asynchronous device what its samples are: what a loop pays, for every candidate alike."""
        for device in dict.fromkeys(c.device for c in asynchronous):
            note = (f"{device}: every candidate timed as a training loop runs it, step by step on the device's own "
                    "clock while the host launches the next step, after an untimed step that takes the queue's "
                    "fill and a cold start; fp16 with an unfused optimizer waits for GradScaler's inf check every "
                    "step there, as in a loop, fp16 with the fused optimizer does not")
            if note not in self.notes:
                self.notes.append(note)

    def _steady_s(self, candidate: Candidate) -> float | None:
        """Its step time when it was last timed (it warms up afresh, towards it); None if never timed."""
        rounds = self._rounds(candidate)
        return _stats.median(rounds) / 1000 if rounds else None

    def _rounds(self, candidate: Candidate) -> list[float]:
        timing = self.roster.results[candidate].timing
        return timing.round_ms if timing is not None else []

    def _rivals(self, alive: list[Candidate], leader: Candidate, stage: int) -> list[Candidate]:
        """In the last stage, the device's other live precisions that a tie would go to, where some variant
        settings of the leader's precision may pay (:meth:`_donors`): each is timed again next to those settings
        in its own precision, so the tie rule meets the best of every precision, not a plain one the settings
        would beat by more than its margin allows."""
        if stage != self._last_stage or not self._donors(alive, leader):
            return []  # the rivals' own best stays comparable
        return [c for c in alive if c.device == leader.device and c.precision != leader.precision
                and _rules.tie_winner(c, leader) == c]

    def _donors(self, alive: list[Candidate], leader: Candidate) -> list[Candidate]:
        """The live variants of the leader's precision whose settings may beat it plain by more than a pick may
        give away (the same math's indifference): all but those an interval rules out. A few rounds' estimate
        gave a gain of a few percent away to the tie rule one time in five, and a plain leader ahead by chance
        left its fused variant's settings untried in the precision the tie then went to."""
        base = leader.base
        found = [c for c in dict.fromkeys([leader, *alive])
                 if c.device == leader.device and c.precision == leader.precision and c != c.base]
        if base not in alive or not self._rounds(base):
            return found
        return [c for c in found if not self._rounds(c)  # (never timed next to it: no interval rules it out)
                or _stats.ratio_interval(self._rounds(base), self._rounds(c))[2] > 1 + _rules.indifference(base, c)]

    def _variants(self, alive: list[Candidate], stage: int) -> list[Candidate]:
        found: list[Candidate] = []
        for device in dict.fromkeys(c.device for c in alive):
            leader = self._leader(alive, device)
            tried = [c for c in self.roster.results if c.device == device and self._stage(c) == stage - 1]
            proposed = variants(leader, stage, self.roster.facts[leader], search=self.settings.search,
                                default_threads=self.lab.default_threads, tried=tried)
            proposed += [donor.model_copy(update={"precision": rival.precision})
                         for rival in self._rivals(alive, leader, stage) for donor in self._donors(alive, leader)]
            proposed = [c for c in proposed
                        if c not in self.roster.results and c not in self.excluded and c not in found]
            if self._outpaced(leader) and self._cost_s(leader, len(proposed)) > self._stage_settings(stage).budget_s:
                self.notes.append(f"stage {stage}: {leader.label} not refined (far behind another device, and its "
                                  f"variants would take {self._cost_s(leader, len(proposed)):.1f} s)")
                continue
            found += proposed
        return found

    def _cost_s(self, leader: Candidate, variants: int) -> float:
        """About what timing ``variants`` of ``leader`` costs: each one's verification window and warm-up,
        and the first look's rounds for all of them."""
        step_s = _stats.median(self._rounds(leader)) / 1000
        return step_s * ((self.settings.variant_verify_steps + 3 + _stats.LOOKS[0]) * variants + _stats.LOOKS[0])


__all__ = ["FINAL_STAGE", "Session"]
