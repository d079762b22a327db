"""Truth profiles: hardware that is not here, as it really is.

A :class:`Truth` says how fast each candidate *really* is (its step-time distribution, set-up time, failure,
numerics), how an accelerator runs it (kernels started as they are launched, batch copies that wait or not,
synchronisations, cold starts, clocks and throttle reasons), and how the machine misbehaves while it is
measured (per-step noise, heavy-tailed outliers, a slowdown between stages, a steady ramp, a background
burst). :func:`true_pick` is what the decision rules pick knowing every step time exactly; a truth is read from a
recorded family (:func:`truth_from_record`) or a recorded trace (:func:`truth_from_trace`).
:mod:`autotune.testing.simulate` measures a truth with the real search on a fake clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autotune._records import Candidate, Failure, FamilyResult
from autotune._rules import margin, preference
from autotune._variants import CPU, Facts, precision_row
from autotune.backends import backend_for
from autotune.testing.traces import Replay, TraceFile


@dataclass(frozen=True)
class CandidateTruth:
    """One plain candidate's real behaviour, e.g. ``CandidateTruth(step_ms=5.9, setup_s=4.1)``."""

    step_ms: float
    setup_s: float = 0.2
    failure: Failure | None = None
    init_scale: float | None = None
    default_scale_skipped: int | None = None
    #: this candidate's own heavy tail (share of its steps hit, how much slower), on top of the machine's
    outlier_rate: float = 0.0
    outlier_factor: float = 3.0
    #: every ``stall_every``-th step of this candidate (its own count) takes ``stall_ms`` more: an allocator that
    #: returns memory every few steps, a periodic synchronisation; its training loop pays them
    stall_every: int = 0
    stall_ms: float = 0.0
    #: on an accelerator, the host's time to launch one step's kernels: a loop's launches overlap the device's
    #: work, so a step there takes the longer of the two (``step_ms`` is the device's)
    launch_ms: float = 0.0
    #: on a pipelined accelerator (``Truth.pipelined``), the host's time per step before its first kernel
    #: (Python, the batch's copy call): the device idles through it in a step synchronised alone, where a loop
    #: hides it behind the step before
    lead_ms: float = 0.0
    #: this candidate's own log-normal sigma per step, instead of the machine's ``noise``
    noise: float | None = None
    #: its accelerator's clock under its load where a power cap holds it below ``Truth.clock_mhz`` (its step time
    #: is already that clock's: the cap holds it in a training loop too), and whether NVML then reports the
    #: power cap as a throttle reason
    clock_mhz: float | None = None
    power_cap_reason: bool = False


@dataclass(frozen=True)
class Loop:
    """How one candidate's steps run on a pipelined accelerator, in seconds (:func:`run_steps`)."""

    compute_s: float
    launch_s: float
    lead_s: float
    copy_s: float
    sync_s: float
    optimizer_share: float
    #: the batch's copy waits for the device's queued work (not ``non_blocking``)
    copies_wait: bool
    #: GradScaler reads its inf check on the host mid-step (fp16 with an optimizer that is not fused)
    scaler_sync: bool


def run_steps(loop: Loop, host: float, device: float, steps: int, device_s: Callable[[float], float],
              ends: list[float] | None = None) -> tuple[float, float]:
    """``steps`` steps from (host, device): when the host is done launching them and when the device is done
    (``ends``: when the device finished each step).

    Each step: its batch copy (queued, or waited for), the host's lead, then forward and backward, GradScaler's
    check where it reads one, and the optimizer step. In a phase the host launches kernels for ``launch`` seconds
    while the device runs them as they come, ``work`` seconds in all: it ends once both are done.
    ``device_s(start)``: the step's device seconds when the device starts it at ``start``."""
    share = loop.optimizer_share
    for _ in range(steps):
        if loop.copies_wait:
            host = device = max(host, device) + loop.sync_s + loop.copy_s
        else:
            device = max(device, host) + loop.copy_s
        host += loop.lead_s
        work = device_s(max(device, host))
        host, device = _phase(host, device, (1 - share) * loop.launch_s, (1 - share) * work)
        if loop.scaler_sync:
            host = max(host, device) + loop.sync_s
        host, device = _phase(host, device, share * loop.launch_s, share * work)
        if ends is not None:
            ends.append(device)
    return host, device


def _phase(host: float, device: float, launch: float, work: float) -> tuple[float, float]:
    return host + launch, max(max(device, host) + work, host + launch)


def loop_step_s(loop: Loop) -> float:
    """One step's time in a long training loop, without noise: what the candidate's steps cost the user."""
    host = device = 0.0
    host, device = run_steps(loop, host, device, 20, lambda start: loop.compute_s)
    settled = device
    host, device = run_steps(loop, host, device, 20, lambda start: loop.compute_s)
    return (device - settled) / 20


@dataclass(frozen=True)
class Truth:
    """A machine and a family as they really are, and the weather while they are measured."""

    name: str
    candidates: Mapping[Candidate, CandidateTruth]
    #: step-time factor of each variant setting, e.g. ``{"fused-optimizer": 0.9}`` (10% faster); default 1
    variant_factors: Mapping[str, float] = field(default_factory=dict)
    facts: Facts = field(default_factory=lambda: Facts(image_inputs=False, default_optimizer=True))
    default_threads: int = 8
    #: log-normal sigma of every step
    noise: float = 0.03
    #: a slow, machine-wide load (the control sees it too): an AR(1) log factor with this step-to-step
    #: correlation and sigma ``load_noise``; consecutive rounds are then not independent
    load_correlation: float = 0.0
    load_noise: float = 0.0
    #: share of steps hit by an outlier, and how much slower they are
    outlier_rate: float = 0.0
    outlier_factor: float = 3.0
    #: a step right after another candidate's (caches evicted, a thread pool to wake) is this much slower
    switch_penalty: float = 0.0
    #: a candidate's first steps after its set-up are slower, by this much at first, decaying by half a step
    warmup_penalty: float = 0.0
    #: every device but the CPU runs this much slower once stage 1 is over (a GPU throttling: the
    #: pure-Python control on the CPU cannot see it)
    slowdown_after_stage_1: float = 1.0
    #: everything, the control included, slows by this fraction per second (thermal ramp)
    ramp_per_s: float = 0.0
    #: everything, the control included, runs ``burst_factor`` times slower during (start_s, end_s)
    burst: tuple[float, float] | None = None
    burst_factor: float = 2.0
    #: launch-time factor of each variant setting, e.g. ``{"fused-optimizer": 0.3}`` (fewer kernels); default 1
    variant_launch_factors: Mapping[str, float] = field(default_factory=dict)
    #: during (start_s, end_s) every device but the CPU throttles: ``clock_drop_factor`` times slower, its clock
    #: reading that much lower than ``clock_mhz``
    clock_drop: tuple[float, float] | None = None
    clock_drop_factor: float = 1.25
    clock_mhz: float = 1800.0
    #: a plain candidate's own variant factors, over ``variant_factors``: a gain that depends on the device and
    #: precision, e.g. ``{Candidate(device="cuda:0", precision="fp16-mixed"): {"channels_last": 0.79}}``
    candidate_variant_factors: Mapping[Candidate, Mapping[str, float]] = field(default_factory=dict)
    #: after a step of a CPU candidate on more than one thread, its thread pool spin-waits this long (OpenMP),
    #: and a control measured meanwhile runs ``pool_spin_penalty`` slower (a spinning hyper-threaded sibling)
    pool_spin_s: float = 0.0
    pool_spin_penalty: float = 0.0
    #: accelerators run kernel by kernel, as real ones do (:func:`run_steps`): a step's kernels start as they are
    #: launched, so a step synchronised alone takes about the longer of its launch and device time plus its
    #: lead and a synchronisation, not their sum; a batch copy that is not ``non_blocking`` waits for the
    #: device's queued work; fp16 with an unfused optimizer waits mid-step for GradScaler's inf check
    pipelined: bool = False
    #: ... what a synchronisation costs the host (the device's signal reaching it)
    sync_ms: float = 0.0
    #: ... the batch's copy to the device, on the device's queue
    copy_ms: float = 0.0
    #: ... the share of a step's launches and device time that its optimizer step takes
    optimizer_share: float = 0.2
    #: ... an accelerator's first step after another candidate's steps, or after idling for ``idle_after_s`` (the
    #: CPU's turn, the control), is ``idle_penalty_ms`` slower: its clocks ramp up again, its caches refill
    idle_penalty_ms: float = 0.0
    idle_after_s: float = 0.02
    #: an accelerator's clock reading averages its clock over this many seconds (NVML's sample period: its
    #: own work, another candidate's, idle time), where 0 reads it as it is; idle, it runs at ``idle_clock_mhz``
    clock_window_s: float = 0.0
    idle_clock_mhz: float | None = None
    #: a busy machine hurts a step of many threads more than one of few (it waits for its slowest thread): a
    #: CPU candidate feels the load (``load_noise``) to the power (threads / default_threads) ** threads_load;
    #: 0: every candidate alike
    threads_load: float = 0.0
    #: a real machine's recorded weather (:mod:`autotune.testing.traces`): each step also takes the machine's
    #: factor at its moment in the recording (from an offset drawn per run) and its candidate's next own factor
    replay: Replay | None = None

    def load_power(self, candidate: Candidate) -> float:
        """How strongly ``candidate``'s steps feel the machine's load: 1 at torch's thread count."""
        if candidate.device != CPU:
            return 1.0
        return math.pow((candidate.num_threads or self.default_threads) / self.default_threads, self.threads_load)

    def factors(self, base: Candidate) -> Mapping[str, float]:
        """The step-time factor of each variant setting on the plain candidate ``base``."""
        return {**self.variant_factors, **self.candidate_variant_factors.get(base, {})}

    def compute_ms(self, candidate: Candidate) -> float:
        """The device's time for one step of ``candidate``: its plain candidate's, times each variant's factor."""
        base = self.candidates[candidate.base].step_ms
        factors = self.factors(candidate.base)
        return base * math.prod(factors.get(word, 1.0) for word in candidate.variants)

    def launch_ms(self, candidate: Candidate) -> float:
        """The host's time to launch one step of ``candidate`` on an accelerator (0 on the CPU)."""
        if candidate.device == CPU:
            return 0.0
        base = self.candidates[candidate.base].launch_ms
        return base * math.prod(self.variant_launch_factors.get(word, 1.0) for word in candidate.variants)

    def step_ms(self, candidate: Candidate) -> float:
        """The candidate's true mean step time in a training loop: on an accelerator the longer of its launch
        and its device time, which overlap; on a pipelined one, a loop's step that copies its batches as a fast
        loop does (``non_blocking`` where the backend's copies allow it); with its own heavy tail and stalls,
        which the loop pays."""
        loop = self.loop(candidate, copies_wait=not backend_for(candidate.device).async_copies)
        typical = max(self.compute_ms(candidate), self.launch_ms(candidate)) if loop is None else (
            1000 * loop_step_s(loop))
        own = self.candidates[candidate.base]
        stalls = own.stall_ms / own.stall_every if own.stall_every else 0.0
        return typical * (1 + own.outlier_rate * (own.outlier_factor - 1)) + stalls

    def loop(self, candidate: Candidate, *, copies_wait: bool) -> Loop | None:
        """How ``candidate``'s steps run on a pipelined accelerator; None on the CPU or an unpipelined truth."""
        if not self.pipelined or candidate.device == CPU:
            return None
        return Loop(compute_s=self.compute_ms(candidate) / 1000, launch_s=self.launch_ms(candidate) / 1000,
                    lead_s=self.candidates[candidate.base].lead_ms / 1000, copy_s=self.copy_ms / 1000,
                    sync_s=self.sync_ms / 1000, optimizer_share=self.optimizer_share, copies_wait=copies_wait,
                    scaler_sync=precision_row(candidate.precision).grad_scaler and candidate.optimizer != "fused")

    def throttled(self, now: float, device: str) -> bool:
        return device != CPU and self.clock_drop is not None and self.clock_drop[0] <= now < self.clock_drop[1]


def true_pick(truth: Truth, candidates: list[Candidate], expected_steps: int | None = None) -> Candidate:
    """What the decision rules pick when every step time is known exactly (no noise): the right answer."""
    def score(c: Candidate) -> float:
        setup_ms = 1000 * truth.candidates[c.base].setup_s
        return truth.step_ms(c) if expected_steps is None else setup_ms + expected_steps * truth.step_ms(c)

    usable = [c for c in candidates if truth.candidates[c.base].failure is None]
    picks = {}
    for device in dict.fromkeys(c.device for c in usable):
        on_device = [c for c in usable if c.device == device]
        unbeaten = [c for c in on_device
                    if not any(score(o) * (1 + margin(o, c)) < score(c) for o in on_device if o != c)]
        picks[device] = min(unbeaten, key=lambda c: (preference(c), score(c)))
    best = min(picks.values(), key=score)
    cpu = picks.get(CPU)
    if cpu is not None and best != cpu and score(best) * (1 + margin(best, cpu)) >= score(cpu):
        return cpu
    return best


def true_score(truth: Truth, candidate: Candidate, expected_steps: int | None = None) -> float:
    step = truth.step_ms(candidate)
    return step if expected_steps is None else 1000 * truth.candidates[candidate.base].setup_s + expected_steps * step


def truth_from_record(measured: FamilyResult, **weather: object) -> Truth:
    """A recorded family (e.g. ``fixtures/machines/*.json``) read as a truth profile: each plain
    candidate's recorded median step time, set-up time, failure and GradScaler facts become its truth, and each
    one-setting variant's median over its plain candidate's becomes that candidate's factor for the setting.

    A recorded channels_last result means the workload had 4-D inputs: the facts say so unless ``facts`` is
    given."""
    candidates: dict[Candidate, CandidateTruth] = {}
    plain_ms = {r.candidate: r.timing.median_ms for r in measured.candidates
                if r.candidate == r.candidate.base and r.timing is not None}
    factors: dict[Candidate, dict[str, float]] = {}
    for result in measured.candidates:
        if result.candidate != result.candidate.base:
            base_ms = plain_ms.get(result.candidate.base)
            if len(result.candidate.variants) == 1 and result.timing is not None and base_ms is not None:
                word = result.candidate.variants[0]
                factors.setdefault(result.candidate.base, {})[word] = result.timing.median_ms / base_ms
            continue
        numerics = result.numerics
        candidates[result.candidate] = CandidateTruth(
            step_ms=result.timing.median_ms if result.timing is not None else 1.0,
            setup_s=result.setup_s or 0.2,
            failure=result.failure,
            init_scale=numerics.init_scale if numerics is not None else None,
            default_scale_skipped=numerics.default_scale_skipped if numerics is not None else None,
        )
    if "facts" not in weather and any("channels_last" in words for words in factors.values()):
        weather["facts"] = Facts(image_inputs=True, default_optimizer=True)
    return Truth(name=measured.model_kind, candidates=candidates, candidate_variant_factors=factors,
                 **weather)  # type: ignore[arg-type]


def truth_from_trace(trace: TraceFile, replay: Replay, *, name: str,
                     faster: tuple[Candidate, Candidate, float] | None = None, ties: bool = False) -> Truth:
    """A recorded trace (``fixtures/traces/*.json.gz``) as a truth profile replaying its weather
    (``Truth.replay``): each plain candidate's recorded mean step time (its warm-up's where it was left out, far
    behind) becomes its truth, and each one-setting variant's mean over its plain candidate's that candidate's
    factor for the setting (a combination's is the product).

    ``faster`` = (rival, reference, gap) makes the rival's true mean the reference's / (1 + gap): where the rival
    is the reference with one setting more, through that setting's factor; where it is another precision with
    the same settings, through its plain candidate's time (its variants keep their ratios to it). Its recorded
    spread, tail and bursts stay as they were. ``ties``: every other setting's factor is 1, so the pair is the
    only question (a tie is never wrong), where a short recording's means would add close calls of their own."""
    means = {one.candidate: statistics.fmean(one.steps.step_ms) for one in trace.candidates}
    means.update({candidate: ms for candidate, ms in trace.left_out})
    candidates = {c: CandidateTruth(step_ms=ms) for c, ms in means.items() if c == c.base}
    factors: dict[Candidate, dict[str, float]] = {}
    for candidate, ms in means.items():
        if len(candidate.variants) == 1 and candidate.base in means:
            factors.setdefault(candidate.base, {})[candidate.variants[0]] = 1.0 if ties else ms / means[candidate.base]

    def truth() -> Truth:
        return Truth(name=name, candidates=candidates, candidate_variant_factors=factors, facts=trace.facts,
                     default_threads=trace.machine.default_threads, noise=0.0, replay=replay)

    if faster is None:
        return truth()
    rival, reference, gap = faster
    scale = truth().compute_ms(reference) / (1 + gap) / truth().compute_ms(rival)
    more = set(rival.variants) - set(reference.variants)
    if rival.base == reference.base and len(more) == 1 and set(reference.variants) <= set(rival.variants):
        word = more.pop()
        factors.setdefault(rival.base, {})[word] = factors.get(rival.base, {}).get(word, 1.0) * scale
    elif rival.base != reference.base and set(rival.variants) == set(reference.variants):
        candidates[rival.base] = CandidateTruth(step_ms=candidates[rival.base].step_ms * scale)
    else:
        raise ValueError(f"{rival.label} is neither {reference.label} with one setting more nor another precision "
                         "with its settings: shift a pair of those")
    return truth()


__all__ = [
    "CandidateTruth", "Loop", "Truth", "loop_step_s", "run_steps", "true_pick", "true_score", "truth_from_record",
    "truth_from_trace",
]
