"""``python -m autotune --explain KIND``: one family in detail: every candidate measured, the decision against each
rival, demotions, and what training loops saw, with a legend under each table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._answer import cached_configs, cached_families, demotions
from autotune._cache.freshness import retry_at
from autotune._cache.loops import of as loops_of
from autotune._console import Col, calibrate_with_progress, console, fitted, mib, strict_json
from autotune._decision import Decision
from autotune._families import family_names
from autotune._fingerprint import fingerprint
from autotune._loop_wording import demotion_words, loop_words
from autotune._records import FP32_CPU, Candidate, CandidateResult, FamilyResult, Prefer, Rival
from autotune._wording import qualifiers, ratio_words, retry_words, time_words, times_over

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def explain(kind: str, *, recalibrate: bool, as_json: bool, prefer: Prefer = "auto", steps: int | None = None) -> int:

    # A kind registered here is measured again when stale; one only another process registered is shown
    # as the cache holds it.
    fresh = cached_families([kind], fresh_only=kind in family_names())
    if recalibrate or kind not in fresh:
        calibrate_with_progress([kind], force=recalibrate)
    measured = cached_families([kind])[kind]
    config = cached_configs([kind], prefer=prefer, expected_steps=steps)[kind]
    if as_json:  # the public record: the Config, its evidence every candidate against the pick
        print(strict_json(config))
        return 0

    out = console()
    out.print(f"[bold]{kind}[/bold] measured {measured.measured_at} in {measured.wall_s:.1f} s"
              + ("  [yellow]noisy[/yellow]" if measured.noisy else ""))
    rows = measured.candidates
    out.print(fitted(out, [
        Col("candidate", [r.candidate.label for r in rows]),
        Col("timed in", [timed_in(r) for r in rows]),
        Col("step", [time_words(r.timing.mean_ms) if r.timing else
                     f"({time_words(r.first_step_ms)})" if r.first_step_ms else "-" for r in rows], wraps=False),
        Col("rounds", [f"{r.timing.n} x {r.timing.steps_per_round}" if r.timing else "-" for r in rows],
            wraps=False),
        Col("vs fp32 CPU", [vs_fp32_cpu(r, measured, config) for r in rows]),
        Col("set-up", [time_words(1000 * r.setup_s) if r.setup_s is not None else "-" for r in rows], wraps=False),
        Col("peak MiB", [mib(r.peak_bytes / 2**20 if r.peak_bytes is not None else None,
                             r.peak_reserved_bytes / 2**20 if r.peak_reserved_bytes is not None else None)
                         for r in rows]),
        Col("numerics", [f"{r.numerics.loss_error:.1e} {r.numerics.update_cosine:.3f}" if r.numerics else "-"
                         for r in rows]),
    ], title="measured"))
    out.print(f"[dim]{MEASURED_LEGEND}[/dim]", highlight=False)
    for r in measured.candidates:
        if r.failure is not None:
            out.print(f"{r.candidate.label} {r.failure.kind}: {r.failure.detail}; {retry_words(retry_at(measured, r))}",
                      highlight=False)
    for note in measured.search_notes:
        out.print(f"[dim]{note}[/dim]", highlight=False)
    for backend, why in measured.backend_notes.items():
        out.print(f"[dim]{backend}: {why}[/dim]")
    for demotion in demotions(kind):
        out.print(f"[yellow]{demotion_words(demotion)}[/yellow]; python -m autotune --forget-demotion {kind} "
                  "undoes it", highlight=False)
    for seen in loops_of(fingerprint().digest, kind):  # the loop end to end, beside the step measured above
        out.print(loop_words(seen), highlight=False)
    out.print(f"decision: {config.reason}", highlight=False)
    if config.evidence is not None:
        out.print(evidence_table(config, out))
        out.print(f"[dim]{EVIDENCE_LEGEND}[/dim]", highlight=False)
        for line in qualifiers(config.evidence, init_scale=config.init_scale):
            out.print(f"[dim]{line}[/dim]", highlight=False)
    return 0


def evidence_table(config: Decision, out: Console) -> Table:
    """Every other candidate against the pick: its verdict, time ratio (to the pick, or to the candidate it
    stopped against), interval and paired rounds, or its failure."""
    pick = config.candidate
    rivals = config.evidence.rivals if config.evidence is not None else []

    def why(rival: Rival) -> str:
        against = "the pick" if rival.against == pick else rival.against.label if rival.against else ""
        if rival.failure:
            return f"{rival.failure.kind} (above)"
        if rival.far_behind:
            return f"{against}, far behind after one round"
        if rival.verdict == "tie":
            return f"{against}, not faster by more than {rival.margin:.0%}" if rival.margin else \
                f"{against}, not confidently faster"
        return against

    def interval(rival: Rival) -> str:
        ratio = rival.ratio
        if ratio is None or rival.far_behind:
            return "-"
        return f"{ratio.low:.2f}-{ratio.high:.2f}" if ratio.high != float("inf") else "unpaired"

    return fitted(out, [
        Col("candidate", [r.candidate.label for r in rivals]),
        Col("verdict", [r.verdict for r in rivals]),
        Col("time ratio", [ratio_words(r.ratio.estimate) if r.ratio else "-" for r in rivals], wraps=False),
        Col("interval", [interval(r) for r in rivals], wraps=False),
        Col("rounds", [str(r.rounds) if r.rounds is not None else "-" for r in rivals], wraps=False),
        Col("against / why", [why(r) for r in rivals]),
    ], title=f"against the pick, {pick.label}")


#: what the columns of --explain's tables say, printed under them
MEASURED_LEGEND = (
    "timed in: the search stage whose rounds give its step time (final: the paired comparison that decides), or "
    "failed; step: mean step time (in parentheses: its first step only); rounds: R x S, R interleaved rounds of "
    "S steps each; vs fp32 CPU: its step time over fp32 on the CPU's (an interval: timed in the same rounds; "
    "~: from mean step times of other rounds); set-up: device, model and first step; peak MiB: the most memory its "
    "steps held (of what the allocator reserved); numerics: the largest relative loss error against fp32 on the CPU, "
    "then the cosine of its parameter update with fp32's")


EVIDENCE_LEGEND = (
    "verdict: slower; tie (not faster by its margin: the simpler one wins); faster (the preference or "
    "AUTOTUNE_DEVICE chose the pick); finishes later (its set-up outweighs its faster steps for --steps); dropped "
    "or outpaced (a search stage found it, or its device, clearly slower); unpaired (never timed in the same "
    "rounds); failed; time ratio: its step time over the pick's, or over what it was dropped or outpaced "
    "against; interval: the 95% interval of that ratio; rounds: the paired rounds behind it; against / why: what "
    "the ratio is against, and why it lost")


def vs_fp32_cpu(result: CandidateResult, measured: FamilyResult, config: Decision) -> str:
    """Its step time over fp32 on the CPU's, e.g. ``'0.55x (0.52-0.58)'`` where they were timed in the same rounds,
    ``'0.3x'`` from the decision's paired evidence (a chain of ratios to the pick), ``'~0.33x'``
    from mean step times."""
    timing = result.timing
    baseline = measured.result(FP32_CPU)
    if timing is None or baseline is None or baseline.timing is None or result.candidate == FP32_CPU:
        return "-"
    if timing.vs_baseline is not None:
        paired = timing.vs_baseline
        return f"{ratio_words(paired.estimate)} ({paired.low:.2f}-{paired.high:.2f})"
    evidence, pick = config.evidence, config.candidate

    def over_pick(candidate: Candidate) -> float | None:
        if candidate == pick:
            return 1.0
        rival = next((r for r in evidence.rivals if r.candidate == candidate), None) if evidence else None
        return times_over(rival, pick, evidence) if rival is not None and evidence is not None else None

    mine, fp32 = over_pick(result.candidate), over_pick(FP32_CPU)
    if mine is not None and fp32:
        return ratio_words(mine / fp32)
    return f"~{ratio_words(timing.mean_ms / baseline.timing.mean_ms)}"


def timed_in(result: CandidateResult) -> str:
    """Where its timing comes from: ``'final'`` (the paired comparison), ``'stage 2'``, or ``'failed'`` (its kind and
    detail follow the table)."""
    if result.failure is not None:
        return "failed"
    if result.timing is None:
        return "-"
    return "final" if result.timing.final else f"stage {result.timing.stage}"


__all__ = ["EVIDENCE_LEGEND", "MEASURED_LEGEND", "evidence_table", "explain", "timed_in", "vs_fp32_cpu"]
