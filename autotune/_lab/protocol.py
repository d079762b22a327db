"""What crosses the process boundary between the host and the calibration worker, as typed models.

The host writes one :class:`Job` line on the worker's stdin; the worker answers with one :data:`Event` per
line on its stdout. Both sides validate with the same models: nothing crosses as a dict built by hand.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from autotune._apply.fp32 import Fp32Settings
from autotune._families import Family
from autotune._lab.measure import MeasureSettings
from autotune._records import Candidate, CandidateResult, Drop, Failure, MachineLoad, NoiseCause
from autotune._reports import TraceReport
from autotune._variants import Facts, Search


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class CalibrationSettings(_Message):
    """What the host asks of one family's calibration."""

    seed: int = 0
    #: the first steps of every candidate, checked against the fp32 CPU reference; they also warm it up
    verify_steps: int = 8
    #: ... and of a variant (layout, optimizer kernels, threads) of a verified precision: the same math, and
    #: its set-up is the main fixed cost of the later search stages
    variant_verify_steps: int = 4
    #: False runs the same steps unchecked, which prices the numerics gate
    verify: bool = True
    #: a first step this many times slower than the same device's best first step stops the candidate
    slow_first_step_factor: float = 8.0
    #: ... provided it also took at least this long (steps of tiny models are all noise); later steps too
    slow_step_floor_s: float = 0.5
    #: a later step this many times slower than the best steady step so far stops the candidate
    slow_step_factor: float = 20.0
    #: "precision": device x precision only; "default": also layout, optimizer and CPU threads, staged;
    #: "extended": also torch.compile (compile time counts as set-up: tens of seconds per candidate)
    search: Search = "default"
    #: the family's timing budget (``budget_s``) and the knobs every stage shares
    measure: MeasureSettings = MeasureSettings()
    #: shares of the budget for the pruning stages (1: precisions, 2: variants, 3: combinations and
    #: threads); the final comparison gets the rest, at least ``final_share``
    stage_shares: tuple[float, float, float] = (0.3, 0.15, 0.15)
    final_share: float = 0.4
    #: pruning stages only prune: what they cannot resolve in this many rounds goes to the final comparison
    prune_max_rounds: int = 10


class Checkpoint(_Message):
    """Where one family's staged search stands after a pruning stage: what a restarted worker resumes from.

    ``results`` holds every candidate's result so far (timings, drop evidence, failures); ``alive`` the
    candidates the next stage builds on, with what their workload says about variants (``facts``); ``behind``
    the devices far behind another one, with the evidence.
    """

    event: Literal["checkpoint"] = "checkpoint"
    stage: int
    alive: list[Candidate]
    facts: list[tuple[Candidate, Facts]]
    results: list[CandidateResult]
    behind: dict[str, Drop]
    notes: list[str]
    control_ms: list[float]
    loads: list[MachineLoad] = []
    timing_s: float


class Job(_Message):
    """Calibrate one family."""

    kind: Literal["calibrate"] = "calibrate"
    #: the family as the host resolved it (name, build reference, version): the worker imports its build by name
    family: Family
    #: candidates an earlier worker of this family found failing (it crashed, hung, ran out of memory): a
    #: restarted worker searches on without them
    failed: list[CandidateResult] = []
    #: the last stage an earlier worker of this family finished: a restarted worker continues from there
    resume: Checkpoint | None = None
    settings: CalibrationSettings
    #: the host's fp32 settings: mixed precisions run with them, as they will in the app (fp32 and tf32 set
    #: their own)
    fp32: Fp32Settings
    #: the intra-op thread count candidates without their own run with: in a job, each process's share of the
    #: cores; else None, the worker's :func:`~autotune._fingerprint.default_threads` (torch's default for the
    #: environment the fingerprint holds, whatever the host's own count is now)
    threads: int | None = None
    #: the processes of one job sharing this machine: a CPU candidate is timed while ``processes - 1`` copies of its
    #: step run alongside it (``copies``)
    processes: int = Field(default=1, ge=1)
    #: like multiprocessing's spawn: the worker must import what the host can (user families)
    sys_path: list[str]


class TraceJob(_Message):
    """Run one candidate's measured step under ``torch.profiler`` and write a Chrome trace to ``path``."""

    kind: Literal["trace"] = "trace"
    family: Family
    candidate: Candidate
    init_scale: float | None
    path: str
    warmup_steps: int = 3
    steps: int = 5
    #: operators in the report, most self time first
    top: int = 15
    fp32: Fp32Settings
    sys_path: list[str]


class CheckJob(_Message):
    """Re-time a family's cached pick against fp32 and the runner-up for a few paired rounds (the canary)."""

    kind: Literal["check"] = "check"
    family: Family
    #: fp32 on the CPU first (the too-slow guard compares first steps with it), then the pick and the runner-up
    candidates: list[Candidate]
    pick: Candidate
    settings: CalibrationSettings
    fp32: Fp32Settings
    #: as for a Job
    threads: int | None = None
    sys_path: list[str]


class MemoryProbeJob(_Message):
    """Train one candidate for a few steps at ``batch_size`` and report the peak memory they held."""

    kind: Literal["memory_probe"] = "memory_probe"
    family: Family
    candidate: Candidate
    init_scale: float | None
    batch_size: int = Field(ge=1)
    #: the second step is the steady one: the optimizer state exists and the first step's gradients live
    #: through its forward pass
    steps: int = Field(default=2, ge=1)
    fp32: Fp32Settings
    #: as for a Job
    threads: int | None = None
    sys_path: list[str]


Request = Annotated[Job | TraceJob | CheckJob | MemoryProbeJob, Field(discriminator="kind")]
REQUEST: TypeAdapter[Job | TraceJob | CheckJob | MemoryProbeJob] = TypeAdapter(Request)


class Ready(_Message):
    """The worker imported torch and warmed up; it reads jobs from now on."""

    event: Literal["ready"] = "ready"
    pid: int


class Planned(_Message):
    """Candidates about to be set up: the first plan (with why backends offer none), or a stage's variants."""

    event: Literal["plan"] = "plan"
    candidates: list[Candidate]
    stage: int
    backend_notes: dict[str, str] = Field(default_factory=dict)


class Begin(_Message):
    """The worker starts on ``candidate``: if it dies now, this candidate is the one to blame."""

    event: Literal["begin"] = "begin"
    candidate: Candidate
    phase: Literal["setup", "timing"]
    fraction: float


class Failed(_Message):
    """A candidate failed; ``result`` holds its failure and whatever was measured before it."""

    event: Literal["failed"] = "failed"
    result: CandidateResult


class Done(_Message):
    event: Literal["done"] = "done"
    results: list[CandidateResult]
    control_ms: list[float]
    noisy: bool
    noisy_because: list[NoiseCause] = []
    #: what the operating system saw during each timing window
    loads: list[MachineLoad] = []
    control_shift: float | None = None
    #: how long timing waited for the worker's host to finish its own start-up
    host_wait_s: float = 0.0
    search_notes: list[str]


class Traced(_Message):
    event: Literal["traced"] = "traced"
    report: TraceReport


class Retimed(_Message):
    """One candidate's rounds in a check, round ``i`` of every candidate being the same round."""

    candidate: Candidate
    round_ms: list[float]


class Checked(_Message):
    event: Literal["checked"] = "checked"
    series: list[Retimed]
    noisy: bool


class MemoryProbed(_Message):
    """One memory probe: the peak its steps held (None where the backend cannot tell), the device's free
    memory before it started, or the failure that stopped it (``oom`` when the batch did not fit)."""

    event: Literal["memory_probed"] = "memory_probed"
    batch_size: int
    peak_bytes: int | None
    peak_reserved_bytes: int | None
    free_bytes: int | None
    failure: Failure | None = None


Event = Annotated[Ready | Planned | Begin | Failed | Checkpoint | Done | Traced | Checked | MemoryProbed,
                  Field(discriminator="event")]
EVENT: TypeAdapter[Ready | Planned | Begin | Failed | Checkpoint | Done | Traced | Checked | MemoryProbed] = (
    TypeAdapter(Event))

__all__ = [
    "EVENT", "REQUEST", "Begin", "CalibrationSettings", "CheckJob", "Checked", "Checkpoint", "Done", "Event", "Failed",
    "Job", "MemoryProbeJob", "MemoryProbed", "Planned", "Ready", "Request", "Retimed", "TraceJob",
    "Traced",
]
