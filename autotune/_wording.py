"""The words of a decision for people: its reason (one sentence of at most ``REASON_CHARS`` from the
evidence), the evidence's other lines (no usable GPU, the qualifiers, a failure's retry), a ratio, a time or an
amount of memory, and others' text as autotune may repeat it (:func:`printable`). Pure: words from records; nothing
here measures or decides. The training loop's words: ``autotune._loop_wording``."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence

from autotune import _variants
from autotune._records import (
    FP32_CPU,
    Candidate,
    Choice,
    Demotion,
    Evidence,
    FailureKind,
    FamilyResult,
    MachineLoad,
    NoiseCause,
    Rival,
)
from autotune._rules import known

# -- others' text ------------------------------------------------------------------------------------------------

#: the most characters of one string from outside that autotune repeats: several times the longest it writes itself
#: (a failure's first line, a dataset's signature: a few hundred)
TEXT_CHARS = 1000
#: C0 and C1 control characters and DEL: escape sequences (ESC, CSI), carriage returns, bells, line breaks
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: the control characters that separate words (tab, line breaks): a space, so the words stay apart
_SPACING = re.compile(r"[\t\n\v\f\r\x85]")


def printable(text: str) -> str:
    """``text`` from outside (a file, another process's name) as a terminal may be shown it: no control character
    (an escape sequence cannot clear the screen or forge a line; a carriage return cannot hide what precedes it;
    tabs and line breaks become spaces), at most ``TEXT_CHARS`` characters, the cut marked ``…``."""
    if _CONTROL.search(text) is not None:
        text = _CONTROL.sub("", _SPACING.sub(" ", text))
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "…"


# -- amounts -----------------------------------------------------------------------------------------------------


def ratio_words(ratio: float) -> str:
    """A ratio for people, to 2 significant digits, e.g. ``'2.5x'``, ``'0.55x'``, ``'24x'``."""
    rounded = float(f"{ratio:.2g}")
    return (f"{rounded:.1f}" if 1 <= rounded < 10 else f"{rounded:g}") + "x"


def time_words(ms: float) -> str:
    """A time for people, in ms or s as fits, e.g. ``'0.42 ms'``, ``'58 ms'``, ``'592 ms'``, ``'4.1 s'``."""
    if ms >= 999.5:
        return f"{float(f'{ms / 1000:.2g}') if ms < 9950 else round(ms / 1000):g} s"
    return f"{float(f'{ms:.2g}') if ms < 99.5 else round(ms):g} ms"


def mib_words(value: float | None) -> str:
    """Bytes in MiB for a sentence, e.g. ``'12.5 MiB'``, or ``'an unknown amount'``."""
    return "an unknown amount" if value is None else f"{value / 2**20:.1f} MiB"


def cores_words(cores: float) -> str:
    """CPU time in cores, e.g. ``'0.9 of a core'``, ``'1 core'``, ``'2.5 cores'``."""
    rounded = round(cores, 1)
    if rounded < 1:
        return f"{rounded:g} of a core"
    return "1 core" if rounded == 1 else f"{rounded:g} cores"


# -- what made a measurement noisy --------------------------------------------------------------------------------

#: causes that mean the machine was busy; the others are the measurement's own
_BUSY: frozenset[NoiseCause] = frozenset({"other_processes", "steal", "control_shift"})


def noise_words(causes: Sequence[NoiseCause], loads: Sequence[MachineLoad], control_shift: float | None, *,
                brief: bool = False) -> str:
    """What made a measurement noisy, to follow "measured", e.g. "while another process (python3, pid 4242) used
    0.9 of a core" (``brief``: "while python3 used 0.9 of a core"), "while the hypervisor took 12% of the CPU time
    and the control workload's speed moved by 30%", "with a close call the final comparison left open"; "on a busy
    machine" for a result that did not record why."""
    busy = [_busy_words(cause, loads, control_shift, brief=brief) for cause in causes if cause in _BUSY]
    if busy and _unseen_shift(causes, loads):
        busy = [f"the machine's speed moved by {control_shift or 0.0:.0%}"
                + ("" if brief else " with no other process running (its host, or its clock)")]
    own = ["with a close call the final comparison left open" if cause == "open_gap" else
           "while a device throttled" for cause in causes if cause not in _BUSY]
    parts = ([f"while {_listed(busy)}"] if busy else []) + own
    return ", ".join(parts) if parts else "on a busy machine"


def _unseen_shift(causes: Sequence[NoiseCause], loads: Sequence[MachineLoad]) -> bool:
    """The control moved while the operating system, watching, saw no other process and no hypervisor take the
    machine: its host (a virtual machine's neighbours) or its clock changed its speed. Nothing the user runs
    made it busy, so "run on a quiet machine" is advice they cannot follow."""
    return ("control_shift" in causes and not {"other_processes", "steal"} & set(causes)
            and any(load.other_cores is not None for load in loads))


def remeasure_advice(causes: Sequence[NoiseCause], loads: Sequence[MachineLoad]) -> str:
    """What a user can do about a noisy result: a quiet machine where something else took it, else measure again."""
    if _unseen_shift(causes, loads):
        return "`python -m autotune --recalibrate` measures it afresh"
    return "`python -m autotune --recalibrate` on a quiet machine measures it afresh"


def _listed(items: Sequence[str]) -> str:
    """``'a, b and c'``"""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _busy_words(cause: NoiseCause, loads: Sequence[MachineLoad], control_shift: float | None, *,
                brief: bool) -> str:
    """One busy cause, e.g. "another process (python3, pid 4242) used 0.9 of a core", "other processes used 1.4
    cores (most: python3, pid 4242, 0.6 of a core)", "the hypervisor took 12% of the CPU time"."""
    if cause == "other_processes":
        window = max(loads, key=lambda load: load.other_cores or 0.0, default=None)
        if window is None:  # a record that names the cause without its windows
            return "other processes took CPU time"
        top = window.processes[0] if window.processes else None
        if top is None or 2 * top.cores < (window.other_cores or 0.0):
            most = f" (most: {top.name}, pid {top.pid}, {cores_words(top.cores)})" if top and not brief else ""
            return f"other processes used {cores_words(window.other_cores or 0.0)}{most}"
        if brief:
            return f"{top.name} used {cores_words(top.cores)}"
        who = "the process calibrating" if top.host else "another process"
        return f"{who} ({top.name}, pid {top.pid}) used {cores_words(top.cores)}"
    if cause == "steal":
        return f"the hypervisor took {max((load.steal or 0.0 for load in loads), default=0.0):.0%} of the CPU time"
    return f"the control workload's speed moved by {control_shift or 0.0:.0%}"


def short_noise_words(causes: Sequence[NoiseCause], loads: Sequence[MachineLoad]) -> str:
    """e.g. "on a busy machine", "in a close call", "while the machine's speed moved"."""
    if _unseen_shift(causes, loads):
        return "while the machine's speed moved"
    if not causes or set(causes) & _BUSY:
        return "on a busy machine"
    return "in a close call" if causes[0] == "open_gap" else "while a device throttled"


# -- the evidence, a line each -----------------------------------------------------------------------------------


def no_gpu_words(measured: FamilyResult) -> str:
    """Why a GPU the user preferred cannot answer, e.g. "there is no usable GPU (cuda: not built)"."""
    gpu_failures = [r for r in measured.candidates if r.candidate.device != _variants.CPU and r.failure is not None]
    if gpu_failures:
        return "every GPU candidate failed (" + "; ".join(
            f"{r.candidate.label} {r.failure.kind}: {r.failure.detail}" for r in gpu_failures if r.failure) + ")"
    notes = "; ".join(f"{name}: {why}" for name, why in measured.backend_notes.items() if name != _variants.CPU)
    return f"there is no usable GPU ({notes})" if notes else "there is no usable GPU"


def qualifiers(evidence: Evidence, *, init_scale: float | None) -> list[str]:
    """What qualifies the answer besides its rivals, one line each: preference, forced device, GradScaler, flags."""
    lines = []
    if evidence.prefer != "auto" or evidence.expected_steps is not None:
        lines.append(f"asked for: prefer={evidence.prefer}, expected_steps={evidence.expected_steps}")
    if evidence.forced is not None:
        lines.append(f"device forced by AUTOTUNE_DEVICE={evidence.forced}")
    if evidence.no_gpu is not None:
        lines.append(f"GPU requested, but {evidence.no_gpu}")
    if evidence.default_scale_skipped:
        lines.append(f"GradScaler starts at init_scale {init_scale:g}: the default 65536 skipped "
                     f"{evidence.default_scale_skipped} of {evidence.verified_steps} verification steps")
    if evidence.noisy:
        measured = "measured " + noise_words(evidence.noisy_because, evidence.loads, evidence.control_shift)
        if evidence.after_noisy is None:
            lines.append(f"{measured}: the next calibration measures it again")
        else:
            lines.append(f"{measured}, after a noisy measurement that picked {evidence.after_noisy.label}: kept; "
                         + remeasure_advice(evidence.noisy_because, evidence.loads))
    if evidence.unresolved:
        lines.append("still open when timing stopped (the pick may be further from the best than the margin "
                     "allows): " + ", ".join(c.label for c in evidence.unresolved))
    if evidence.older_rules is not None:
        lines.append(f"measured under older rules (by autotune {evidence.older_rules}): the next calibration "
                     "measures it again")
    if evidence.origin is not None:
        lines.append(f"measured on another machine with exactly this configuration: {evidence.origin}")
    return lines


def retry_words(at: dt.datetime | None) -> str:
    """When a failure is measured again, from its retry time (None: not before the machine, the family or the
    search changes), e.g. 'retried after 2026-12-01 14:03 UTC'."""
    if at is None:
        return "kept until the machine, the family or the search changes, or --recalibrate"
    if at <= dt.datetime.now(dt.timezone.utc):
        return "retried by the next calibration"
    return f"retried after {at.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, or at once with --recalibrate"


# -- the reason: one sentence from the evidence ------------------------------------------------------------------

#: the longest reason: one line of a log or a status bar; the evidence holds the rest
REASON_CHARS = 160

_FAILURE_WORDS: dict[FailureKind, str] = {
    "crashed": "crashed", "timeout": "timed out", "oom": "ran out of memory", "error": "failed",
    "unsupported": "is unsupported", "numerics": "failed verification", "too_slow": "was too slow",
}


def answer_words(choice: Choice) -> str:
    """e.g. ``'bf16 mixed precision with channels_last and the fused optimizer on the CPU'``"""
    extras = _variants.prose(choice)
    listed = ", ".join(extras[:-1]) + " and " + extras[-1] if len(extras) > 1 else "".join(extras)
    return (_variants.precision_row(choice.precision).prose + (f" with {listed}" if listed else "")
            + f" on {_where(choice.device)}")


def _where(device: str) -> str:
    """e.g. ``'the CPU'``, ``'cuda:0'``"""
    return "the CPU" if device == _variants.CPU else device


def _named(candidate: Candidate, pick: Candidate) -> str:
    """A rival in the fewest words that tell it from the pick, e.g. ``'cuda:0'``, ``'fp32'``, ``'plain bf16 mixed
    precision'``, ``'bf16 mixed precision with channels_last'``."""
    if candidate.device != pick.device:
        return _where(candidate.device)
    precision = _variants.precision_row(candidate.precision).prose
    if candidate.variants:
        return f"{precision} with " + ", ".join(_variants.prose(candidate))
    return f"plain {precision}" if candidate.precision == pick.precision else precision


def _device_claim(pick: Candidate, evidence: Evidence) -> str | None:
    """The device choice in words: the pick against another device that was faster (the user's choice or a short
    job kept the pick), else one that tied, else the closest one behind."""
    timed = [r for r in evidence.rivals if r.role == "device" and r.ratio is not None
             and r.verdict in ("slower", "tie", "faster", "finishes later", "outpaced")]
    if not timed:
        return None
    rank = {"faster": 0, "finishes later": 0, "tie": 1}
    best = min(timed, key=lambda r: (rank.get(r.verdict, 2), r.ratio.estimate if r.ratio else 0.0))
    times = times_over(best, pick, evidence) or (best.ratio.estimate if best.ratio else 1.0)
    where = _where(best.candidate.device)
    if best.verdict == "finishes later":
        return (f"finishes {evidence.expected_steps} steps first: {where}'s set-up of "
                f"{time_words(1000 * (best.setup_s or 0.0))} outweighs its faster steps")
    if best.verdict == "faster":
        if evidence.forced is not None:
            return f"{where} is {ratio_words(1 / times)} faster per step"
        return f"as requested, though {where} is {ratio_words(1 / times)} faster per step"
    if best.verdict == "tie":
        return f"{where} was no faster" + (", and on a tie the CPU wins" if pick.device == _variants.CPU else "")
    return f"{ratio_words(times)} faster per step than {where}"


def _precision_claim(pick: Candidate, evidence: Evidence) -> str | None:
    """The pick against plain fp32 on its device; an fp32 pick whose settings did not clearly beat plain fp32
    (the same math, a tie) against the other precisions instead: why not a lower one."""
    same = [r for r in evidence.rivals if r.role != "device"]
    fp32 = next((r for r in same if r.candidate == Candidate(device=pick.device, precision=_variants.FP32.name)), None)
    gained = fp32 is not None and fp32.verdict in ("slower", "dropped", "outpaced")
    if pick.precision != _variants.FP32.name or gained:
        return _against(fp32, pick, evidence) if fp32 is not None and fp32.verdict != "failed" else None
    timed = [r for r in same if r.role == "precision" and r.verdict not in ("failed", "untimed", "unpaired")]
    if timed:
        return _against(min(timed, key=lambda r: times_over(r, pick, evidence) or float("inf")), pick, evidence)
    failed = [r for r in same if r.role == "precision" and r.failure is not None]
    if failed:
        return "; ".join(f"{_named(r.candidate, pick)} {_FAILURE_WORDS[r.failure.kind]}" for r in failed if r.failure)
    return "the only candidate measured" if not evidence.rivals else None


def times_over(found: Rival, pick: Candidate, evidence: Evidence, seen: frozenset[Candidate] = frozenset()
                ) -> float | None:
    """``found``'s step time over the pick's, from paired evidence: its ratio to the pick, or to what it stopped
    against times that one's to the pick (a chain of drops); None where the chain breaks."""
    if found.ratio is None or found.against is None:
        return None
    if found.against == pick:
        return found.ratio.estimate
    via = next((r for r in evidence.rivals if r.candidate == found.against), None)
    if via is None or via.candidate in seen:
        return None
    rest = times_over(via, pick, evidence, seen | {found.candidate})
    return None if rest is None else found.ratio.estimate * rest


def headline(found: Rival, pick: Candidate, evidence: Evidence) -> tuple[float, bool] | None:
    """``found``'s step time over the pick's as a user reads it, from paired evidence: its ratio to the pick, or
    to what it stopped against times that one's to the pick (a chain of drops, the intervals multiplied). The
    estimate where the interval lies within ``_rules.HEADLINE_ERROR`` of it; else the interval's low end, a bound
    (True), e.g. fp32 dropped after a few noisy rounds: (2.9, True), "at least 2.9x faster". None where the chain
    breaks or the bound says no more than "not slower"."""
    estimate = low = high = 1.0
    seen: set[Candidate] = set()
    link: Rival | None = found
    while link is not None and link.ratio is not None and link.against is not None and link.candidate not in seen:
        seen.add(link.candidate)
        estimate, low, high = estimate * link.ratio.estimate, low * link.ratio.low, high * link.ratio.high
        if link.against == pick:
            if known((estimate, low, high)):
                return estimate, False
            return (low, True) if low > 1 else None
        link = next((r for r in evidence.rivals if r.candidate == link.against), None)
    return None


def _against(found: Rival, pick: Candidate, evidence: Evidence) -> str:
    """e.g. ``'2.5x faster per step than fp32'``, ``'bf16 mixed precision was no faster'``: a training step's time,
    not the loop's (its data loading is not in it)."""
    name = _named(found.candidate, pick)
    times = times_over(found, pick, evidence)
    claim = headline(found, pick, evidence) if times is not None and times >= 1 else None  # estimate, or a bound
    if found.verdict in ("dropped", "slower", "outpaced") and claim is None:
        return f"{name} was clearly slower"
    if found.verdict not in ("dropped", "slower", "outpaced") or claim is None:
        return f"{name} was no faster"
    return f"{'at least ' if claim[1] else ''}{ratio_words(claim[0])} faster per step than {name}"


def reason(pick: Candidate, evidence: Evidence, *, measured_at: str | None) -> str:
    """One sentence of at most :data:`REASON_CHARS`: the answer, then its strongest evidence, or what it falls
    back to and why; where the whole does not fit, the weaker parts are left to ``evidence``, down to the answer
    and its qualifiers in a word each."""
    answer = answer_words(pick)
    short = answer_words(pick.base)
    if evidence.unmeasured is not None:
        return _fallback(pick, answer, evidence, short)
    lead = [*([f"forced by AUTOTUNE_DEVICE={evidence.forced}"] if evidence.forced is not None else []),
            *([f"GPU requested, but {evidence.no_gpu.partition(' (')[0]}"] if evidence.no_gpu is not None else [])]
    claims = [c for c in (_device_claim(pick, evidence), _precision_claim(pick, evidence)) if c]
    rules = ["under older rules"] if evidence.older_rules is not None else []
    causes = evidence.noisy_because
    flags = [*([short_noise_words(causes, evidence.loads)] if evidence.noisy else []), *rules]
    noise = ([noise_words(causes[:1], evidence.loads, evidence.control_shift, brief=True)]
             if evidence.noisy and causes else [])
    when = f"measured {measured_at[:10]}" if measured_at else "measured"
    said = f"{when} {', '.join([*noise, *rules])}" if noise else when
    if flags:
        when += " " + ", ".join(flags)
    measured_again = evidence.older_rules is not None or (evidence.noisy and evidence.after_noisy is None)
    again = "; the next calibration measures it again" if measured_again else ""
    origin = f", {evidence.origin}" if evidence.origin else ""
    short_origin = f", {evidence.origin.split()[0]}" if evidence.origin else ""
    marks = [word for word in ("forced" if evidence.forced else "", "no usable GPU" if evidence.no_gpu else "",
                               *flags, short_origin[2:]) if word]
    return _fitting(answer, [
        *([_said([*lead, ", ".join(claims)], f"({said}{again}){origin}")] if noise else []),
        _said([*lead, ", ".join(claims)], f"({when}{again}){origin}"),
        _said([*lead, ", ".join(claims)], f"({when}){origin}"),
        _said([*lead, *claims[:1]], f"({when}){origin}"),
        _said([*lead, *claims[:1]], f"({when}){short_origin}"),
        _said(lead[:1], f"({when}){short_origin}"),
        _said([], f"({', '.join(marks or [when])})"),
    ], short=short)


def _said(parts: Sequence[str], tail: str) -> str:
    """What follows the answer: ``': part; part (tail)'``, or only ``' (tail)'``."""
    body = "; ".join(part for part in parts if part)
    return f": {body} {tail}" if body else f" {tail}"


def _fallback(pick: Candidate, answer: str, evidence: Evidence, short: str) -> str:
    """What an answer without a measurement of this machine falls back to, and why."""
    why = evidence.unmeasured or ""
    if evidence.forced is not None:
        return _fitting(answer, [f": forced by AUTOTUNE_DEVICE={evidence.forced}; {why}",
                                 f": forced by AUTOTUNE_DEVICE={evidence.forced}, which calibration did not measure"],
                        short=short)
    if evidence.similar is None:
        always = ", which always trains" if pick == FP32_CPU else ""
        return _fitting(answer, [f"{always}: no measurement of this machine yet ({why})",
                                 f": not measured here yet ({why})", ": not measured here yet"], short=short)
    differences = evidence.similar.differences
    then = ", ".join(f"{d.name} {d.then}" for d in differences)
    first = f"{differences[0].name} {differences[0].then}" if differences else "other software"
    return _fitting(answer, [f": the pick measured with {then} on the same hardware; not measured here yet ({why})",
                             f": the pick measured with {first} on the same hardware; not measured here yet ({why})",
                             f": the pick measured with {first} on the same hardware; not measured here yet",
                             ": the pick measured on the same hardware; not measured here yet",
                             ": as measured on the same hardware, not measured here yet"], short=short)


def demoted_reason(latest: Demotion, now: Choice) -> str:
    """The reason of an answer without what a training run demoted, e.g. "bf16-mixed was demoted after NaN losses
    at step 5,120 of training on 2026-12-03; using fp32": one sentence, the variants named only where they fit
    (the Config lists them all)."""
    same_device = latest.candidate.device == now.device
    was = latest.candidate.precision if same_device else f"{latest.candidate.device} {latest.candidate.precision}"
    using = now.precision if same_device else f"{now.device} {now.precision}"
    return _fitting(f"{was} was demoted after {latest.words} at step {latest.step:,} of training on "
                    f"{latest.at[:10]}; using ", [using + now.variant_words, using])


def agreed_reason(choice: Candidate, own: Candidate, cost: float | None, *, decided_by: int,
                  plain: bool = False) -> str:
    """The reason of a rank that trains with its job's choice where its own machine picked ``own``, and what its own
    measurements say the choice costs there (``cost``: the choice's step time over ``own``'s; ``plain``: the two
    precisions without their variants, which the search here did not try), e.g. "bf16 mixed precision on the CPU:
    the job's choice (rank 0's machine measured it); here 1.4x slower per step than fp32, this machine's own pick"."""
    chose = f": the job's choice (rank {decided_by}'s machine measured it)"
    named, short = _named(own, choice), _named(own.base, choice.base)
    if plain:
        same = own.device == choice.device
        named = short = _variants.precision_row(own.precision).prose if same else _where(own.device)
    without = ", without its variants," if plain else ""
    if cost is None:
        here, brief = f"not measured here, where {named} is the pick", f"not measured here, where {short} is the pick"
    elif cost >= 1.005:
        here = f"here{without} {ratio_words(cost)} slower per step than {named}"
        brief = f"here{without} {ratio_words(cost)} slower than {short}"
    else:
        here, brief = f"here{without} no slower than {named}", f"here{without} no slower than {short}"
    answer, short_answer = answer_words(choice), answer_words(choice.base)
    return _fitting("", [*(f"{said}{chose}; {part}" for part in (f"{here}, this machine's own pick", here)
                           for said in (answer, short_answer)),
                         *(f"{said}{chose}; {brief}" for said in (answer, short_answer)),
                         f"{short_answer}: the job's choice (rank {decided_by}'s machine)"])


def _fitting(answer: str, forms: Sequence[str], *, short: str | None = None) -> str:
    """``answer`` and the first (most detailed) of ``forms`` that fits in :data:`REASON_CHARS`; else the ``short``
    answer (no variants: the Config lists them all) with the last form."""
    return next((answer + form for form in forms if len(answer + form) <= REASON_CHARS),
                (short or answer) + forms[-1])


__all__ = [
    "REASON_CHARS",
    "TEXT_CHARS",
    "agreed_reason",
    "answer_words",
    "cores_words",
    "headline",
    "mib_words",
    "no_gpu_words",
    "noise_words",
    "printable",
    "qualifiers",
    "ratio_words",
    "reason",
    "remeasure_advice",
    "retry_words",
    "short_noise_words",
    "time_words",
    "times_over",
]
