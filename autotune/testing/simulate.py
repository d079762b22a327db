"""Truth profiles measured by the real search and decision code on a fake clock.

:func:`simulate` runs the real ``Session`` (stages, sequential timing, final comparison) against a
:class:`~autotune.testing.truth.Truth` with a seeded random stream and a fake clock, and returns the
``FamilyResult`` a worker would have returned; the real ``decide`` then picks from it. Nothing here hands
ready-made timings to ``decide``: the code must find the right answer under the noise.

Used by ``tests/sim/test_simulated.py`` (a seeded subset) and ``benchmarks/decision_sim.py`` (rates over many runs).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import Callable, Sequence

from autotune._lab.load import SETTLE_MAX_S
from autotune._lab.prepare import CandidateFailed, Prepared
from autotune._lab.protocol import CalibrationSettings, Checkpoint, Done
from autotune._lab.session import Session
from autotune._lab.step import pins_batches
from autotune._records import FP32_CPU, Candidate, CandidateResult, ClockEvent, FamilyResult, Numerics
from autotune._variants import CPU
from autotune.backends import ClockReading, backend_for
from autotune.testing.traces import Cursor
from autotune.testing.truth import CandidateTruth, Loop, Truth, run_steps

#: the control workload's true time: pure Python on the CPU
CONTROL_MS = 1.0


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
        if self.stage_1_over and device != CPU:
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
        self.asynchronous = device != CPU
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
        if self.device == CPU:
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
        if device == CPU:
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
        return "the CPU reports no clock events" if device == CPU else None

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
                         pooled=candidate.device == CPU and candidate.num_threads != 1,
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
                      control=_FakeStep(CONTROL_MS / 1000, CPU, _ControlWeather(weather)),
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


__all__ = ["FakeClock", "TruthLab", "simulate"]
