"""The exception tree: one root, subclasses that keep the offending values and say what to do next."""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Iterable, Sequence


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class UnknownFamilyError(AutotuneError, KeyError):
    """A model kind that is neither built in nor registered, e.g. ``'cnm'``."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(name, self.known)

    def __str__(self) -> str:
        by_case = {kind.lower(): kind for kind in self.known}
        close = difflib.get_close_matches(str(self.name).lower(), list(by_case), n=1)
        hint = f"did you mean {by_case[close[0]]!r}? " if close else ""
        return f"unknown model kind {self.name!r}; {hint}known: {', '.join(self.known)}"


class FamilyRegistrationError(AutotuneError, ValueError):
    """``register_family`` got something the spawned worker could not import."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = why
        super().__init__(name, why)

    def __str__(self) -> str:
        return f"cannot register model kind {self.name!r}: {self.why}"


class BatchSizeUnsupportedError(AutotuneError, TypeError):
    """``max_batch_size`` needs a family whose ``build`` takes ``batch_size``; this one's does not."""

    def __init__(self, name: str, ref: str) -> None:
        self.name = name
        self.ref = ref
        super().__init__(name, ref)

    def __str__(self) -> str:
        return (f"model kind {self.name!r} cannot be built at another batch size: {self.ref} takes no batch_size "
                "argument. Give it one with your training batch as the default, e.g. "
                "def build(batch_size: int = 8) -> autotune.Workload, and register it again")


class MaxBatchError(AutotuneError, RuntimeError):
    """No batch size could be confirmed to fit, e.g. even a batch of 1 needs more than the limit."""

    def __init__(self, model_kind: str, candidate: str, why: str) -> None:
        self.model_kind = model_kind
        self.candidate = candidate
        self.why = why
        super().__init__(model_kind, candidate, why)

    def __str__(self) -> str:
        return (f"no batch size of {self.model_kind!r} on {self.candidate} fits: {self.why}. Raise memory_limit_mb, "
                "lower margin, free memory on the device, or try another device or precision")


class ConfigurationError(AutotuneError, ValueError):
    """An invalid option or ``AUTOTUNE_*`` environment variable; ``why``, where the value has the right form but
    names nothing usable here (a device this process cannot use), says what there is instead."""

    def __init__(self, variable: str, value: object, expected: str, *, why: str | None = None) -> None:
        self.variable = variable
        self.value = value
        self.expected = expected
        self.why = why
        super().__init__(variable, value, expected, why)

    def __str__(self) -> str:
        return f"{self.variable}={self.value!r} is invalid: {self.why or f'expected {self.expected}'}"


class FrameworkError(AutotuneError, ValueError):
    """A Config a training framework would silently run otherwise, e.g. fp16 on the CPU through Lightning."""

    def __init__(self, framework: str, setting: str, why: str) -> None:
        self.framework = framework
        self.setting = setting
        self.why = why
        super().__init__(framework, setting, why)

    def __str__(self) -> str:
        return f"{self.framework} cannot run this Config's {self.setting} as measured: {self.why}"


class TraceError(AutotuneError, RuntimeError):
    """Profiling one candidate's training step failed, e.g. its worker crashed; ``kind`` and ``detail`` say how."""

    def __init__(self, model_kind: str, candidate: str, kind: str, detail: str) -> None:
        self.model_kind = model_kind
        self.candidate = candidate
        self.kind = kind
        self.detail = detail
        super().__init__(model_kind, candidate, kind, detail)

    def __str__(self) -> str:
        return (
            f"tracing {self.model_kind!r} on {self.candidate} failed ({self.kind}: {self.detail}); run "
            f"`python -m autotune --explain {self.model_kind}` to see how this candidate fared when measured"
        )


class CalibrationError(AutotuneError, RuntimeError):
    """Every candidate of a model kind failed; ``failures`` maps candidate to its failure."""

    def __init__(self, model_kind: str, failures: Sequence[tuple[str, str]]) -> None:
        self.model_kind = model_kind
        self.failures = list(failures)
        super().__init__(model_kind, self.failures)

    def __str__(self) -> str:
        lines = "; ".join(f"{candidate}: {why}" for candidate, why in self.failures)
        return (
            f"no candidate could train {self.model_kind!r} on this machine ({lines}). "
            "Fix the model kind's build() or run `python -m autotune --explain "
            f"{self.model_kind}` for details"
        )


class WorkerStartError(AutotuneError, RuntimeError):
    """The calibration worker process could not start, or started something other than autotune's worker (in a
    frozen app without ``autotune.freeze_support()``, a second copy of the app); nothing is measured or stored.
    ``argv`` is its command line, ``status`` its exit status (None: still running when it was killed),
    ``stderr`` its last lines."""

    def __init__(self, why: str, argv: Sequence[str], *, status: int | None = None, stderr: Sequence[str] = (),
                 advice: str) -> None:
        self.why = why
        self.argv = list(argv)
        self.status = status
        self.stderr = [line.rstrip() for line in stderr if line.strip()]
        self.advice = advice
        super().__init__(why, self.argv, status, self.stderr, advice)

    def __str__(self) -> str:
        status = f", exit status {self.status}" if self.status is not None else ""
        said = f"; its stderr ended: {' | '.join(self.stderr[-5:])[-600:]}" if self.stderr else ""
        return (f"the calibration worker could not start: {self.why} (command: {shlex.join(self.argv)}{status})"
                f"{said}. {self.advice}")


class CalibrationCancelled(AutotuneError):
    """A calibration was cancelled (``CalibrationJob.cancel()``); families finished before it stay stored."""

    def __init__(self, model_kind: str | None = None, *, finished: Sequence[str] = (),
                 missing: Sequence[str] = ()) -> None:
        self.model_kind = model_kind
        self.finished = list(finished)
        self.missing = list(missing)
        super().__init__(model_kind, self.finished, self.missing)

    def __str__(self) -> str:
        done = f"; measured and stored: {', '.join(self.finished)}" if self.finished else ""
        rest = f"; not measured: {', '.join(self.missing)}" if self.missing else ""
        return (f"calibration cancelled{f' during {self.model_kind}' if self.model_kind else ''}{done}{rest}. "
                "Start it again (autotune.start_calibration) to measure the rest")


class CalibrationPending(AutotuneError, TimeoutError):
    """``CalibrationJob.wait(timeout)`` ran out of time; the job goes on."""

    def __init__(self, kinds: Sequence[str], timeout_s: float) -> None:
        self.kinds = list(kinds)
        self.timeout_s = timeout_s
        super().__init__(self.kinds, timeout_s)

    def __str__(self) -> str:
        return (f"calibration of {', '.join(self.kinds)} still running after {self.timeout_s:g} s; wait again, or "
                "answer now with best_config(kind, wait=False)")


class ConfigMisbehaved(AutotuneError, UserWarning):
    """A training run's guard saw its configuration misbehave (``Config.guard()``): a warning, or with
    ``on_failure="raise"`` an exception. ``demoted`` says whether ``best_config`` now answers another one for this
    model; ``why`` what the guard's replay found (None for fp32 on the CPU, the reference)."""

    def __init__(self, model_kind: str, candidate: str, step: int, seen: str, *, demoted: bool,
                 why: str | None = None) -> None:
        self.model_kind = model_kind
        self.candidate = candidate
        self.step = step
        self.seen = seen
        self.demoted = demoted
        self.why = why
        super().__init__(model_kind, candidate, step, seen, demoted, why)

    def __str__(self) -> str:
        what = f"{self.model_kind} on {self.candidate} misbehaved at step {self.step:,}: {self.seen}. "
        if self.why is None:
            return what + ("fp32 on the CPU is the reference every candidate is verified against, so nothing is "
                           "demoted: look at the learning rate, the data and the model")
        if not self.demoted:
            return what + (f"{self.why[0].upper()}{self.why[1:]}, so nothing is demoted: look at the learning rate "
                           "(lower it, or warm it up), the data (NaN or extreme values) and the loss")
        return what + (f"{self.why[0].upper()}{self.why[1:]}: it is demoted on this machine for this model; restart "
                       "from your last checkpoint with guard.fallback() (what best_config(kind, model=model) now "
                       f"answers); `python -m autotune --forget-demotion {self.model_kind}` undoes it")


class RanksError(AutotuneError, RuntimeError):
    """The processes of one job (torchrun, Lightning, Accelerate) could not agree on an answer: a rank died, hung,
    failed or answered something else. Raised on every rank that learns of it, instead of a hang in training."""

    def __init__(self, model_kind: str | None, why: str) -> None:
        self.model_kind = model_kind
        self.why = why
        super().__init__(model_kind, why)

    def __str__(self) -> str:
        about = f" on {self.model_kind!r}" if self.model_kind is not None else ""
        return (f"the ranks of this job could not agree{about}: {self.why}. Every rank must call best_config with the "
                "same arguments, in the same order; look at the other ranks' logs")


class DatasetError(AutotuneError, ValueError):
    """``Config.dataloader_kwargs`` cannot load the dataset: it is empty, has no length, or raised (the dataset's
    own exception is the ``__cause__``); nothing was cached."""

    def __init__(self, dataset: str, why: str) -> None:
        self.dataset = dataset
        self.why = why
        super().__init__(dataset, why)

    def __str__(self) -> str:
        return f"cannot measure loading {self.dataset}: {self.why}; nothing was cached"


class ImportFileError(AutotuneError, ValueError):
    """A results file given to ``--import`` or ``AUTOTUNE_DEFAULTS`` cannot be used; nothing was written.
    ``unreadable``: the file could not be read at all (a wrong path), rather than read and refused."""

    def __init__(self, path: str, why: str, *, unreadable: bool = False) -> None:
        self.path = path
        self.why = why
        self.unreadable = unreadable
        super().__init__(path, why, unreadable)

    def __str__(self) -> str:
        if self.unreadable:
            return f"cannot use results file {self.path}: {self.why}. Nothing was imported; check the path"
        return (f"cannot use results file {self.path}: {self.why}. Nothing was imported; export it again with "
                "`python -m autotune --export FILE` on the machine that measured it")


__all__ = [
    "AutotuneError",
    "BatchSizeUnsupportedError",
    "CalibrationCancelled",
    "CalibrationError",
    "CalibrationPending",
    "ConfigMisbehaved",
    "ConfigurationError",
    "DatasetError",
    "FamilyRegistrationError",
    "FrameworkError",
    "ImportFileError",
    "MaxBatchError",
    "RanksError",
    "TraceError",
    "UnknownFamilyError",
]
