"""The records: what a calibration found, stored raw so decisions can be re-derived later, and what a guard
found (``autotune._reports`` holds what the loop and the tools report)."""

from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune import _variants
from autotune._variants import MemoryFormat, OptimizerImpl, Precision, Prefer

#: every precision's name, simplest first
PRECISIONS: tuple[Precision, ...] = tuple(row.name for row in _variants.PRECISION_ROWS)

FailureKind = Literal["crashed", "timeout", "oom", "error", "unsupported", "numerics", "too_slow"]
Misbehaviour = Literal["non_finite", "skipped_steps", "diverged"]
#: whose doing a training run's misbehaviour was, as the guard's replay found it
Blame = Literal["configuration", "training", "not_reproduced", "unreplayed"]
#: why a device holds its clocks down, as NVML reports it: not idling, not an application's clock setting
ClockEvent = Literal["thermal", "power_cap", "hw_slowdown"]


class Record(BaseModel):
    """Frozen, explicit fields; unknown keys from a newer minor writer are ignored."""

    # A non-finite float is written as the string "Infinity" / "-Infinity" / "NaN" (an unbounded ratio interval,
    # a NaN loss): strict JSON parsers refuse the bare constants, and null would fail validation on the next read.
    # Reading takes both those strings and the bare constants older files hold.
    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="strings")


class Choice(Record):
    """What a candidate sets and a Config applies: the device, the precision and each variant, e.g.
    ``device="cpu", precision="bf16-mixed", memory_format="channels_last"``.

    The variants, one field per axis of :mod:`autotune._variants`: the memory format of the model and of 4-D
    inputs, the optimizer's implementation (torch's ``foreach`` or ``fused`` kernels, for the built-in AdamW),
    the CPU thread count (None: torch's default), and ``torch.compile`` (only in the extended search).
    """

    device: str
    precision: Precision
    memory_format: MemoryFormat = _variants.MEMORY_FORMAT.default
    optimizer: OptimizerImpl = _variants.OPTIMIZER.default
    num_threads: int | None = _variants.NUM_THREADS.default
    compiled: bool = _variants.COMPILED.default

    @property
    def variants(self) -> list[str]:
        """The non-default settings, e.g. ``['channels_last', 'fused-optimizer']``; empty for a plain candidate."""
        return [axis.label(value) for axis, value in _variants.changed(self)]

    @property
    def variant_words(self) -> str:
        """e.g. ``' channels_last fused-optimizer'``: what a label adds to device and precision."""
        return "".join(f" {w}" for w in self.variants)


class Candidate(Choice):
    """One configuration to try, e.g. ``Candidate(device="cpu", precision="bf16-mixed")``."""

    @property
    def label(self) -> str:
        """e.g. ``'cpu bf16-mixed'`` or ``'cpu bf16-mixed channels_last 1 thread'``"""
        return f"{self.device} {self.precision}{self.variant_words}"

    @property
    def base(self) -> Candidate:
        """The same device and precision with every variant setting at its default."""
        return Candidate(device=self.device, precision=self.precision)


#: fp32 on the CPU: what every speed-up is against, and the answer that always trains
FP32_CPU = Candidate(device=_variants.CPU, precision=_variants.FP32.name)


class Failure(Record):
    """Why a candidate cannot be used, e.g. ``Failure(kind="crashed", detail="SIGABRT in step")``."""

    kind: FailureKind
    detail: str


class Interval(Record):
    """A ratio of step times with its 95% interval, e.g. ``Interval(estimate=0.55, low=0.52, high=0.58)``."""

    estimate: float
    low: float
    high: float


class Drop(Record):
    """Why a candidate stopped being timed: the evidence that it is clearly slower than ``by``.

    It counts as clearly slower in every later decision and never wins a tie, e.g.
    ``Drop(by=Candidate(device="cpu", precision="bf16-mixed"), ratio=Interval(...), rounds=3, far_behind=False)``.
    """

    by: Candidate
    ratio: Interval = Field(description="this candidate's step time over ``by``'s, paired by round")
    rounds: int
    far_behind: bool = Field(default=False, description="dropped after one round, too far behind for an interval")


class Timing(Record):
    """Interleaved timing of one candidate: one sample per round (that round's time over its steps)."""

    round_ms: list[float]
    steps_per_round: int
    median_ms: float
    spread: float = Field(description="interquartile range / median of the round samples")
    vs_baseline: Interval | None = Field(
        default=None, description="step-time ratio to fp32 on the CPU, paired by round"
    )
    stage: int = Field(default=1, description="the search stage whose interleaved rounds these are")
    final: bool = Field(
        default=False, description="timed in the final paired comparison: the only timings a decision compares"
    )
    dropped: Drop | None = Field(
        default=None, description="the evidence that it is clearly slower than a candidate on its device: never picked"
    )
    outpaced: Drop | None = Field(
        default=None, description="the evidence that another device is clearly faster: it loses the device choice"
    )
    clock_mhz: list[float] = Field(
        default_factory=list, description="the device's clock after each round's sample, where it reports one"
    )
    clock_events: list[list[ClockEvent]] = Field(
        default_factory=list,
        description="what held the device's clocks down after each round's sample, where it reports that (NVML)",
    )

    @property
    def n(self) -> int:
        return len(self.round_ms)

    @property
    def mean_ms(self) -> float:
        """The mean step time over its rounds, stalls included: what a training loop pays per step."""
        return statistics.fmean(self.round_ms)


class Numerics(Record):
    """The candidate's first optimizer steps compared with the fp32 CPU reference from the same seed."""

    losses: list[float]
    grad_norms: list[float]
    loss_error: float = Field(description="max relative loss difference to the reference")
    grad_error: float = Field(description="max relative gradient-norm difference to the reference")
    update_cosine: float = Field(description="cosine between the parameter updates after the window")
    tolerance: float
    init_scale: float | None = None
    skipped_steps: int = 0
    default_scale_skipped: int | None = Field(
        default=None, description="steps skipped at GradScaler's default init_scale, when a lower one was needed"
    )


class CandidateResult(Record):
    """Everything measured for one candidate; ``failure`` set means it must never be picked."""

    candidate: Candidate
    failure: Failure | None = None
    setup_s: float | None = Field(default=None, description=(
        "device init + model to device + first step (+ what a probe's first pass took over its second: the "
        "precision's one-time costs it paid)"))
    first_step_ms: float | None = None
    timing: Timing | None = None
    numerics: Numerics | None = None
    num_threads: int | None = None
    device_name: str | None = None
    peak_bytes: int | None = Field(default=None, description=(
        "the most memory its set-up and verification steps held at once: on the CPU (Linux) what the worker's "
        "peak resident size rose by over its size at the start; CUDA / XPU: allocated; MPS: driver-allocated"))
    peak_reserved_bytes: int | None = Field(
        default=None, description="CUDA / XPU: the most the caching allocator reserved from the device")

    @property
    def usable(self) -> bool:
        return self.failure is None and self.timing is not None


class FamilyKey(Record):
    """What a family's measurements depend on besides the machine; any change measures that family again.

    e.g. ``FamilyKey(reference='autotune._families:build_cnn', version=None, search='default', budget_s=8.0,
    measurement_version=3)``
    """

    reference: str = Field(description="the build function, 'module:function'")
    version: str | None = Field(default=None, description="register_family(version=...): the app's model version")
    search: str = Field(description="AUTOTUNE_SEARCH")
    budget_s: float = Field(description="AUTOTUNE_BUDGET_S")
    measurement_version: int = Field(description="bumped when the meaning of a measurement changes")


#: why a result is noisy: other processes took CPU time while it was timed, the hypervisor took some (steal), the
#: control workload's level moved well past its own noise, the final comparison left a pair the pick rests on open,
#: or a device reported a throttle reason while a candidate's final rounds ran slower
NoiseCause = Literal["other_processes", "steal", "control_shift", "open_gap", "throttled"]


class ProcessLoad(Record):
    """A process that took CPU time while candidates were timed, e.g. ``ProcessLoad(name="python3", pid=4242,
    cores=0.91)``."""

    name: str
    pid: int
    cores: float = Field(description="its CPU time over the window's length: 1.0 is a whole core all along")
    host: bool = Field(default=False, description="the worker's host: the app or command that calibrates")


class MachineLoad(Record):
    """What the operating system saw during one timing window of a family (a stage, or one device's share of it),
    e.g. ``MachineLoad(stage=3, window_s=1.2, other_cores=0.95, steal=0.0, host_cores=0.01,
    processes=[ProcessLoad(name="python3", pid=4242, cores=0.91)])``."""

    stage: int = 0
    window_s: float
    other_cores: float | None = Field(default=None, description=(
        "CPU time every process but the worker took of what the worker may use (the CPUs of its affinity, or its "
        "cgroup's CPU quota), in cores; None where the operating system does not tell"))
    other_share: float | None = Field(default=None, description=(
        "``other_cores`` as a share of what the worker may use: 0.25 for half a core of 2 (None: not read)"))
    steal: float | None = Field(default=None, description=(
        "share of the machine's CPU time its hypervisor took for other machines (steal time)"))
    host_cores: float | None = Field(default=None, description="of ``other_cores``, what the worker's host took")
    processes: list[ProcessLoad] = Field(default_factory=list, description=(
        "the other processes that took the most, most first"))


class FamilyResult(Record):
    """One calibration of one model kind on one machine."""

    model_kind: str
    key: FamilyKey | None = Field(default=None, description="what it was measured for; None: an older record")
    rules: str | None = Field(default=None, description=(
        "digest of the rules it was measured and pruned by (settings, margins, looks, tolerances); None: an "
        "older record"))
    measured_at: str
    autotune_version: str
    wall_s: float
    worker_start_s: float = Field(default=0.0, description="the first worker's start, included in wall_s")
    budget_s: float
    candidates: list[CandidateResult]
    control_ms: list[float] = Field(default_factory=list, description="control workload, one per controlled round")
    noisy: bool = False
    noisy_because: list[NoiseCause] = Field(default_factory=list, description=(
        "why it is noisy; empty for a noisy result of an autotune that did not record why"))
    loads: list[MachineLoad] = Field(default_factory=list, description=(
        "what the operating system saw during each timing window, in order"))
    control_shift: float | None = Field(default=None, description=(
        "how far the control workload's level moved between the first and the second half of its rounds, "
        "e.g. 0.04; None for a result of an autotune that did not record it"))
    host_wait_s: float = Field(default=0.0, description=(
        "how long timing waited for the worker's host to finish its own start-up"))
    after_noisy: Candidate | None = Field(default=None, description=(
        "measured again because the result before it was noisy: that result's pick. It is kept, noisy or not: a "
        "family is measured again automatically at most once for its noise"))
    backend_notes: dict[str, str] = Field(
        default_factory=dict, description="why a backend offered no candidate, e.g. {'cuda': 'not built'}"
    )
    search_notes: list[str] = Field(default_factory=list, description="what each search stage tried and pruned")
    origin: str | None = Field(
        default=None, description="measured on another machine with this fingerprint: where it came from, "
        "e.g. 'imported from results.json on 2026-11-30'"
    )

    def result(self, candidate: Candidate) -> CandidateResult | None:
        return next((r for r in self.candidates if r.candidate == candidate), None)


Role = Literal["device", "precision", "variant"]
Verdict = Literal["slower", "tie", "faster", "finishes later", "dropped", "outpaced", "unpaired", "failed", "untimed"]


class Rival(Record):
    """Another candidate of the calibration against the pick, e.g. ``Rival(candidate=Candidate(device="cpu",
    precision="fp32"), role="precision", verdict="slower", against=<the pick>, ratio=Interval(estimate=1.7,
    low=1.2, high=2.3), rounds=8, step_ms=98.6, margin=0.03)``.

    ``role``: another device, another precision on the pick's device, or the pick's device and precision with
    other variants. ``verdict``: ``slower``; ``tie`` (not faster by more than ``margin`` at the decision's
    confidence: the tie rule chose); ``faster`` (the user's preference or ``AUTOTUNE_DEVICE`` chose the pick);
    ``finishes later`` (faster steps, but its set-up outweighs them for the expected steps); ``dropped`` (a
    search stage found it clearly slower than ``against``); ``outpaced`` (its device clearly slower than
    ``against``'s); ``unpaired`` (timed, never in the same rounds as the pick: no confidence either way, the
    preferred one wins); ``failed`` (``failure`` says why); ``untimed``.
    """

    candidate: Candidate
    role: Role
    verdict: Verdict
    against: Candidate | None = Field(
        default=None, description="what ``ratio`` divides by: the pick, or what it was dropped or outpaced against")
    ratio: Interval | None = Field(default=None, description=(
        "its step time over ``against``'s, paired by round; an unbounded interval where the two were never paired"))
    rounds: int | None = Field(default=None, description="the paired rounds behind ``ratio``")
    far_behind: bool = Field(default=False, description="dropped after one round, too far behind for an interval")
    step_ms: float | None = None
    setup_s: float | None = None
    margin: float | None = Field(default=None, description="the gain over the pick it needed to win, e.g. 0.03")
    failure: Failure | None = None


class Difference(Record):
    """A software fingerprint field that differs from this machine's, e.g. ``Difference(name="torch",
    then="2.12.0", now="2.13.0")``."""

    name: str
    then: str
    now: str


class SimilarMachine(Record):
    """The record a fallback answered from: the same hardware with other software, measured at ``measured_at``."""

    differences: list[Difference]
    measured_at: str


class Ranks(Record):
    """The job of many processes an answer was agreed for (torchrun, Lightning, Accelerate), e.g. ``Ranks(rank=3,
    local_rank=1, world_size=4, local_world_size=2)``: this process's place in it."""

    rank: int
    local_rank: int = Field(description="the rank among the processes sharing this machine")
    world_size: int
    local_world_size: int = Field(description="the processes sharing this machine (torchrun's --nproc-per-node)")

    @property
    def nodes(self) -> int:
        """Machines in the job, e.g. 2 for 4 processes, 2 per machine."""
        return max(1, self.world_size // self.local_world_size)


class Agreement(Record):
    """How a rank's answer relates to the job's choice, e.g. ``Agreement(decided_by=0, own=Candidate(device="cpu",
    precision="fp32"), cost=1.4)``: the job trains with what the deciding rank's machine measured best; a machine
    whose own measurements disagree says what that choice costs there."""

    decided_by: int = Field(description="the rank whose machine's measurements chose for the whole job")
    own: Candidate | None = Field(default=None, description=(
        "this machine's own pick, where it differs from the job's choice"))
    cost: float | None = Field(default=None, description=(
        "the job's choice's step time over ``own``'s, as measured on this machine, e.g. 1.4; None where this machine "
        "did not measure its precision"))
    measured_as: Candidate | None = Field(default=None, description=(
        "what ``cost`` timed here: the job's choice, or where this machine's search did not try its variants, its "
        "precision without them (against ``own``'s precision without them)"))


class Replay(Record):
    """What the guard's replay found: copies of the model and optimizer restarted from a state kept on the host and
    trained again on the batches the run saw since, in the run's precision and in the reference (fp32), e.g.
    ``Replay(blame="training", from_step=300, steps=50, since=50, reference=Candidate(device="cpu",
    precision="fp32"), reference_at=31, detail="...")``.

    ``blame``: ``configuration`` (the run's precision misbehaves again and the reference does not: demoted),
    ``training`` (the reference misbehaves too), ``not_reproduced`` (neither does: the batches that did are gone),
    ``unreplayed`` (no replay was possible; ``detail`` says why).
    """

    blame: Blame
    detail: str = Field(description="what the replay saw, or why there was none, in words")
    from_step: int | None = Field(default=None, description="the step the kept state was taken after")
    steps: int | None = Field(default=None, description="the batches replayed")
    since: int | None = Field(default=None, description="the steps the run trained from the kept state to the read")
    reference: Candidate | None = Field(default=None, description="what the replay compared with: fp32 on the device")
    reference_at: int | None = Field(default=None, description="the replayed step where the reference misbehaved")
    run_at: int | None = Field(default=None, description="the replayed step where the run's precision misbehaved")


class Demotion(Record):
    """What a training run saw its measured candidate do (``Config.guard()``), kept for this machine: from then on
    ``best_config`` answers without that precision on that device.

    e.g. ``Demotion(model_kind="cnn", candidate=Candidate(device="cpu", precision="bf16-mixed"),
    seen="non_finite", step=5120, detail="3 NaN losses within 100 steps (steps 5,120-5,122)", evidence=[...],
    at="2026-12-03T10:04:00+00:00", autotune_version="0.1.0")``
    """

    model_kind: str
    candidate: Candidate = Field(description="the candidate the run trained with, its variants included")
    seen: Misbehaviour
    step: int = Field(description="the training step at which the evidence begins, counted from 1")
    detail: str = Field(description="what was seen, in words")
    evidence: list[float] = Field(description=(
        "the numbers behind it: the non-finite or diverging losses, or the loss scales around the skipped steps"))
    at: str = Field(description="when it was recorded, ISO 8601 UTC")
    autotune_version: str
    model: str | None = Field(default=None, description=(
        "what was trained: the model's class and a digest of its parameters' names and shapes, e.g. 'Sequential "
        "5c3e2a09d1f4'; None in a record of an older autotune, which holds for the model the family builds"))
    family_model: bool = Field(default=False, description=(
        "the model is the one the family builds: what best_config(kind) answers for"))
    replay: Replay | None = Field(default=None, description="the replay that blamed the configuration")

    def __eq__(self, other: object) -> bool:
        """Field by field, a NaN in ``evidence`` equal to a NaN: two reads of one demotion are equal."""
        if not isinstance(other, Demotion):
            return NotImplemented
        return self.model_dump_json() == other.model_dump_json()

    __hash__ = Record.__hash__

    @property
    def words(self) -> str:
        """e.g. ``'NaN losses'``, ``'skipped optimizer steps'``, ``'a diverging loss'``: what the run saw."""
        if self.seen == "non_finite":
            return "NaN losses" if any(math.isnan(v) for v in self.evidence) else "infinite losses"
        return "skipped optimizer steps" if self.seen == "skipped_steps" else "a diverging loss"

    def covers(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is demoted by this: the same device and precision, whatever its variants (a memory
        format, an optimizer kernel or a thread count does not change what the precision's range does to training)."""
        return candidate.device == self.candidate.device and candidate.precision == self.candidate.precision


class Evidence(Record):
    """What a decision rests on, as data (``--explain`` renders it, ``--json`` carries it): every other candidate
    against the pick, and what qualifies the answer, e.g. ``Evidence(device_name="Intel Xeon, 2 threads",
    rivals=[Rival(...), ...], noisy=True)``."""

    device_name: str | None = Field(default=None, description="the picked device as torch names it")
    rivals: list[Rival] = Field(default_factory=list)
    prefer: Prefer = "auto"
    expected_steps: int | None = None
    forced: str | None = Field(default=None, description="AUTOTUNE_DEVICE, when it chose the device")
    no_gpu: str | None = Field(default=None, description="why a GPU the user preferred could not answer")
    default_scale_skipped: int | None = Field(default=None, description=(
        "fp16: verification steps GradScaler's default init_scale skipped, of ``verified_steps``"))
    verified_steps: int | None = None
    noisy: bool = Field(default=False, description="measured while the machine was busy")
    noisy_because: list[NoiseCause] = Field(default_factory=list, description="why it is noisy")
    loads: list[MachineLoad] = Field(default_factory=list, description=(
        "what the operating system saw during each timing window"))
    control_shift: float | None = Field(default=None, description=(
        "how far the control workload's level moved during the measurement, e.g. 0.04"))
    after_noisy: Candidate | None = Field(default=None, description=(
        "measured again because the result before it was noisy (that result's pick): kept, noisy or not"))
    older_rules: str | None = Field(default=None, description=(
        "the autotune version that measured it, when its rules differ from this one's"))
    origin: str | None = Field(default=None, description="measured on another machine with this fingerprint: where "
                               "it came from, e.g. 'shipped in results.json'")
    unmeasured: str | None = Field(default=None, description=(
        "why no measurement of this machine configuration answers (a fallback), e.g. 'calibration running in "
        "this process'"))
    similar: SimilarMachine | None = Field(default=None, description="the record of the same hardware it used")
    demotions: list[Demotion] = Field(default_factory=list, description=(
        "what training runs demoted on this machine for this model, which the answer leaves out, oldest first"))
    unresolved: list[Candidate] = Field(default_factory=list, description=(
        "rivals whose comparison with the pick was still open when timing stopped (a close call, or a busy "
        "machine): the pick may be further from the best than the margin allows"))
    agreement: Agreement | None = Field(default=None, description=(
        "in a job of many processes: the rank whose measurements chose, and what this machine's own say"))

__all__ = [
    "FP32_CPU",
    "PRECISIONS",
    "Agreement",
    "Blame",
    "Candidate",
    "CandidateResult",
    "Choice",
    "ClockEvent",
    "Demotion",
    "Difference",
    "Drop",
    "Evidence",
    "Failure",
    "FailureKind",
    "FamilyKey",
    "FamilyResult",
    "Interval",
    "MachineLoad",
    "Misbehaviour",
    "NoiseCause",
    "Numerics",
    "Precision",
    "Prefer",
    "ProcessLoad",
    "Ranks",
    "Replay",
    "Rival",
    "Role",
    "SimilarMachine",
    "Timing",
    "Verdict",
]
