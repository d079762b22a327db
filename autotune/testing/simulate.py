"""Truth profiles: hardware that is not here, driving the real search and decision code on a fake clock.

A :class:`Truth` says how fast each candidate *really* is (its step-time distribution, set-up time, failure,
numerics), how an accelerator runs it (kernels started as they are launched, batch copies that wait or not,
synchronisations, cold starts, clocks and throttle reasons), and how the machine misbehaves while it is
measured (per-step noise, heavy-tailed outliers, a slowdown between stages, a steady ramp, a background
burst). :func:`simulate` runs the real ``Session``
(stages, sequential timing, final comparison) against it with a seeded random stream and a fake clock, and
returns the ``FamilyResult`` a worker would have returned; the real ``decide`` then picks from it. Nothing
here hands ready-made timings to ``decide``: the code must find the right answer under the noise.

Used by ``tests/test_simulated.py`` (a seeded subset) and ``benchmarks/decision_sim.py`` (rates over many runs).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune._lab.load import SETTLE_MAX_S
from autotune._lab.prepare import CandidateFailed, Prepared
from autotune._lab.protocol import CalibrationSettings, Checkpoint, Done
from autotune._lab.session import Session
from autotune._lab.step import pins_batches
from autotune._records import FP32_CPU, Candidate, CandidateResult, ClockEvent, Failure, FamilyResult, Numerics
from autotune._rules import margin, preference
from autotune._variants import Facts, precision_row
from autotune.backends import ClockReading, backend_for
from autotune.testing.traces import Cursor, Replay, TraceFile

#: the control workload's true time: pure Python on the CPU
CONTROL_MS = 1.0


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
        if candidate.device != "cpu":
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
        if candidate.device == "cpu":
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
        if not self.pipelined or candidate.device == "cpu":
            return None
        return Loop(compute_s=self.compute_ms(candidate) / 1000, launch_s=self.launch_ms(candidate) / 1000,
                    lead_s=self.candidates[candidate.base].lead_ms / 1000, copy_s=self.copy_ms / 1000,
                    sync_s=self.sync_ms / 1000, optimizer_share=self.optimizer_share, copies_wait=copies_wait,
                    scaler_sync=precision_row(candidate.precision).grad_scaler and candidate.optimizer != "fused")

    def throttled(self, now: float, device: str) -> bool:
        return device != "cpu" and self.clock_drop is not None and self.clock_drop[0] <= now < self.clock_drop[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Weather:
    """The machine's disturbances as a function of the fake time and of the search's progress."""

    def __init__(self, truth: Truth, clock: FakeClock, rng: random.Random) -> None:
        self.truth = truth
        self.clock = clock
        self.rng = rng
        self.stage_1_over = False
        #: steps timed by the session (not by a set-up's verification window)
        self.timed_steps = 0
        self.in_setup = False
        self._load = [0.0]  # shared with the control's weather: the machine's slow load, in log units
        #: until when the CPU candidates' thread pool spins (shared with the control's weather)
        self.pool_until = [0.0]
        #: the step that ran last (a position effect hits the one after another candidate's)
        self.last_step: object = None
        #: when each pipelined accelerator last finished work, and whose (its next step pays for a change)
        self.busy_until: dict[str, tuple[float, object]] = {}
        #: each accelerator's steps (start, end, clock MHz) within the last clock window, and whose step ran last
        self.busy: dict[str, list[tuple[float, float, float]]] = {}
        self.last_on: dict[str, CandidateTruth | None] = {}
        #: where in the recording this run's fake time 0 falls (``Truth.replay``)
        self.replay_at_s = rng.uniform(0.0, truth.replay.duration_s) if truth.replay is not None else 0.0

    def load(self) -> float:
        """The machine-wide load factor, one AR(1) step further."""
        truth = self.truth
        if truth.load_noise == 0.0:
            return 1.0
        rho = truth.load_correlation
        self._load[0] = rho * self._load[0] + math.sqrt(1 - rho * rho) * self.rng.gauss(0.0, truth.load_noise)
        return math.exp(self._load[0])

    def factor(self, device: str, *, sigma: float | None = None, load_power: float = 1.0) -> float:
        """The machine's factor on one step of ``device`` now (the candidate's own terms are the step's): its
        noise of ``sigma`` (default the machine's), its load to the power ``load_power``."""
        truth, now = self.truth, self.clock.now
        noise = truth.noise if sigma is None else sigma
        value = (1 + truth.ramp_per_s * now) * math.exp(self.rng.gauss(0.0, noise))
        value *= math.pow(self.load(), load_power)
        if truth.burst is not None and truth.burst[0] <= now < truth.burst[1]:
            value *= truth.burst_factor
        if self.stage_1_over and device != "cpu":
            value *= truth.slowdown_after_stage_1
        if truth.throttled(now, device):
            value *= truth.clock_drop_factor
        if self.rng.random() < truth.outlier_rate:
            value *= truth.outlier_factor
        if truth.replay is not None:
            value *= truth.replay.machine(self.replay_at_s + now)
        return value


class _FakeStep:
    def __init__(self, step_s: float, device: str, weather: _Weather, own: CandidateTruth | None = None,
                 launch_s: float = 0.0, loop: Loop | None = None, load_power: float = 1.0,
                 pooled: bool = False, recorded: Cursor | None = None) -> None:
        self.step_s = step_s
        self.device = device
        self.weather = weather
        self.own = own
        self.launch_s = launch_s
        self.loop = loop
        self.load_power = load_power
        self.asynchronous = device != "cpu"
        self.steps = 0
        #: its steps run on a thread pool that spin-waits after them (a CPU candidate on more than one thread)
        self.pooled = pooled
        #: its own factors as recorded (``Truth.replay``)
        self.recorded = recorded

    def run(self, steps: int = 1) -> None:
        """``steps`` steps, then a synchronisation. On an accelerator the host launches step i at i launch
        times, and the device runs it once launched and once the step before it is done: a queue. On a
        pipelined one, kernel by kernel (:func:`run_steps`)."""
        self._run(steps, None)

    def span(self, steps: int) -> list[float]:
        """``steps + 1`` steps, then a synchronisation: the seconds between consecutive steps' ends on the
        device, as its events time them."""
        ends: list[float] = []
        self._run(steps + 1, ends)
        return [later - first for first, later in itertools.pairwise(ends)]

    def _run(self, steps: int, ends: list[float] | None) -> None:
        clock = self.weather.clock
        if self.loop is not None:
            host, device = run_steps(self.loop, clock.now, clock.now, steps, self._pipelined_s, ends)
            clock.now = max(host, device) + self.loop.sync_s
            return
        launched = done = clock.now
        for _ in range(steps):
            launched += self.launch_s
            clock.now = max(done, launched)  # the weather of the moment the device starts it
            start = clock.now
            done = clock.now + self._device_s()
            self._busy(start, done)
            if ends is not None:
                ends.append(done)
        clock.now = done
        if self.pooled:
            self.weather.pool_until[0] = done + self.weather.truth.pool_spin_s

    def _busy(self, start: float, end: float) -> None:
        """Log a step on an accelerator for its windowed clock readings (``Truth.clock_window_s``)."""
        weather, truth = self.weather, self.weather.truth
        if self.device == "cpu":
            return
        weather.last_on[self.device] = self.own
        if truth.clock_window_s:
            mhz = self.own.clock_mhz if self.own is not None and self.own.clock_mhz is not None else truth.clock_mhz
            if truth.throttled(start, self.device):
                mhz /= truth.clock_drop_factor
            log = weather.busy.setdefault(self.device, [])
            log.append((start, end, mhz))
            while log and log[0][1] < end - truth.clock_window_s:
                log.pop(0)

    def _pipelined_s(self, start: float) -> float:
        """A pipelined step's device seconds, started at ``start``: slower after another candidate's steps or
        after the device idled."""
        weather, truth = self.weather, self.weather.truth
        weather.clock.now = start  # the weather of the moment the device starts it
        value = self._device_s()
        until, whose = weather.busy_until.get(self.device, (start, self))
        if whose is not self or start - until >= truth.idle_after_s:
            value += truth.idle_penalty_ms / 1000
        weather.busy_until[self.device] = (start + value, self)
        self._busy(start, start + value)
        return value

    def _device_s(self) -> float:
        weather, truth = self.weather, self.weather.truth
        value = self.step_s * weather.factor(self.device, sigma=self.own.noise if self.own is not None else None,
                                             load_power=self.load_power)
        if self.own is not None:
            if self.own.outlier_rate and weather.rng.random() < self.own.outlier_rate:  # no draw when no tail
                value *= self.own.outlier_factor
            if self.own.stall_every and (self.steps + 1) % self.own.stall_every == 0:
                value += self.own.stall_ms / 1000
            if weather.last_step is not self:
                value *= 1 + truth.switch_penalty
            value *= 1 + truth.warmup_penalty * 0.5 ** self.steps
            weather.last_step = self
        if self.recorded is not None:
            value *= self.recorded.next()
        self.steps += 1
        if not weather.in_setup:
            weather.timed_steps += 1
        return value

    def selected(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class TruthLab:
    """The lab the session asks to set candidates up; here it answers from the truth, on the fake clock."""

    def __init__(self, truth: Truth, weather: _Weather, settings: CalibrationSettings) -> None:
        self.truth = truth
        self.weather = weather
        self.settings = settings
        self.default_threads = truth.default_threads

    def release(self, candidates: list[Candidate]) -> None:
        """Nothing to free on a fake clock."""

    def clock_mhz(self, device: str) -> float | None:
        """An accelerator's clock: nominal, or lower by the drop's factor once it throttles; averaged over the
        last ``clock_window_s`` (its steps at their clocks, idle time at the idle clock) where that is set."""
        if device == "cpu":
            return None
        truth, now = self.truth, self.weather.clock.now
        if not truth.clock_window_s:
            return truth.clock_mhz / (truth.clock_drop_factor if truth.throttled(now, device) else 1.0)
        since = now - truth.clock_window_s
        idle_mhz = truth.clock_mhz if truth.idle_clock_mhz is None else truth.idle_clock_mhz
        busy = [(max(start, since), min(end, now), mhz) for start, end, mhz in self.weather.busy.get(device, [])]
        busy = [(start, end, mhz) for start, end, mhz in busy if end > start]
        busy_s = sum(end - start for start, end, _ in busy)
        weighted = sum((end - start) * mhz for start, end, mhz in busy)
        return (weighted + (truth.clock_window_s - busy_s) * idle_mhz) / truth.clock_window_s

    def clock_check(self, device: str) -> str | None:
        """A simulated accelerator reports its throttle reasons; the CPU none."""
        return "the CPU reports no clock events" if device == "cpu" else None

    def clock_reading(self, device: str) -> ClockReading | None:
        """The clock (:meth:`clock_mhz`) and the reasons in force: thermal while it throttles, the power cap
        while a candidate that reports one ran last."""
        mhz = self.clock_mhz(device)
        if mhz is None:
            return None
        events: list[ClockEvent] = []
        if self.truth.throttled(self.weather.clock.now, device):
            events.append("thermal")
        last = self.weather.last_on.get(device)
        if last is not None and last.power_cap_reason:
            events.append("power_cap")
        return ClockReading(mhz=mhz, events=events)

    def set_up(self, candidate: Candidate) -> Prepared:
        truth = self.truth.candidates[candidate.base]
        clock = self.weather.clock
        if self.weather.timed_steps:
            self.weather.stage_1_over = True  # a set-up after timing began is a later stage's
        clock.now += truth.setup_s
        if truth.failure is not None:
            raise CandidateFailed(CandidateResult(candidate=candidate, failure=truth.failure, setup_s=truth.setup_s))
        # The steps copy their batches as the real step does on that device.
        loop = self.truth.loop(candidate, copies_wait=not pins_batches(backend_for(candidate.device)))
        step = _FakeStep(self.truth.compute_ms(candidate) / 1000, candidate.device, self.weather, truth,
                         launch_s=self.truth.launch_ms(candidate) / 1000, loop=loop,
                         load_power=self.truth.load_power(candidate),
                         pooled=candidate.device == "cpu" and candidate.num_threads != 1,
                         recorded=self._recorded(candidate))
        recent_s = []
        self.weather.in_setup = True
        verify_steps = (self.settings.verify_steps if candidate == candidate.base
                        else self.settings.variant_verify_steps)
        for _ in range(verify_steps):
            started = clock.now
            step.run()
            recent_s.append(clock.now - started)
        self.weather.in_setup = False
        numerics = Numerics(losses=[1.0] * verify_steps, grad_norms=[1.0] * verify_steps, loss_error=0.0,
                            grad_error=0.0, update_cosine=1.0, tolerance=0.05, init_scale=truth.init_scale,
                            default_scale_skipped=truth.default_scale_skipped)
        result = CandidateResult(candidate=candidate, setup_s=truth.setup_s + recent_s[0],
                                 first_step_ms=1000 * recent_s[0], numerics=numerics,
                                 device_name="simulated")
        return Prepared(step, result, recent_s[1:], self.truth.facts)

    def _recorded(self, candidate: Candidate) -> Cursor | None:
        """``candidate``'s own recorded factors from a point drawn for this set-up (``Truth.replay``)."""
        own = self.truth.replay.own_of(candidate) if self.truth.replay is not None else None
        return Cursor(own, self.weather.rng.randrange(len(own.factors))) if own is not None else None


def simulate(truth: Truth, seed: int, settings: CalibrationSettings | None = None, *,
             events: list[object] | None = None, failed: Sequence[CandidateResult] = (),
             resume: Checkpoint | None = None) -> tuple[FamilyResult, float]:
    """One calibration of ``truth`` by the real session, seeded; the result and its simulated seconds.

    ``events`` collects what the session emits; ``failed`` and ``resume`` are what a worker restarted after a
    crash is handed (the candidates that failed, the last stage finished)."""
    settings = settings or CalibrationSettings()
    rng = random.Random(seed)
    clock = FakeClock()
    weather = _Weather(truth, clock, rng)
    lab = TruthLab(truth, weather, settings)
    events = [] if events is None else events
    session = Session(lab, settings, events.append, clock=clock,
                      control=_FakeStep(CONTROL_MS / 1000, "cpu", _ControlWeather(weather)),
                      settle=_settle(weather), discard_on_device_error=False)
    planned = sorted(truth.candidates, key=lambda c: c != FP32_CPU)
    session.run(planned, staged=True, backend_notes={}, failed=failed, resume=resume)
    done = next(e for e in events if isinstance(e, Done))
    result = FamilyResult(
        model_kind=truth.name, measured_at="simulated", autotune_version="simulated", wall_s=clock.now,
        budget_s=settings.measure.budget_s, candidates=done.results,
        control_ms=done.control_ms, noisy=done.noisy, noisy_because=done.noisy_because,
        control_shift=done.control_shift, search_notes=done.search_notes,
    )
    return result, clock.now


class _ControlWeather(_Weather):
    """The control sees what happens to the whole machine (ramp, burst), not a GPU's own throttling."""

    def __init__(self, weather: _Weather) -> None:
        super().__init__(weather.truth, weather.clock, weather.rng)
        self._load = weather._load
        self.pool_until = weather.pool_until
        self.replay_at_s = weather.replay_at_s
        #: the control's runs so far (``Replay.control``)
        self.runs = 0

    def factor(self, device: str, *, sigma: float | None = None, load_power: float = 1.0) -> float:
        """The machine's factor on one step of the control now, and a spinning thread pool's."""
        truth, now = self.truth, self.clock.now
        if truth.replay is not None:
            value = (1 + truth.ramp_per_s * now) * truth.replay.control(self.replay_at_s + now, self.runs)
            self.runs += 1
        else:
            value = (1 + truth.ramp_per_s * now) * math.exp(self.rng.gauss(0.0, 0.01)) * self.load()
        if truth.burst is not None and truth.burst[0] <= now < truth.burst[1]:
            value *= truth.burst_factor
        if now < self.pool_until[0]:
            value *= 1 + truth.pool_spin_penalty
        return value


def _settle(weather: _Weather) -> Callable[[float], None]:
    """The worker's pause before a control (``load.settle``) on the fake clock: ``seconds``, then on while the
    thread pool spins (at most ``SETTLE_MAX_S``)."""
    clock = weather.clock

    def settle(seconds: float) -> None:
        started = clock.now
        clock.now += seconds
        clock.now = max(clock.now, min(weather.pool_until[0], started + SETTLE_MAX_S))
    return settle


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
    cpu = picks.get("cpu")
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
    "CandidateTruth", "FakeClock", "Loop", "Truth", "TruthLab", "loop_step_s", "run_steps", "simulate", "true_pick",
    "true_score", "truth_from_record", "truth_from_trace",
]
