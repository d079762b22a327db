"""``python -m autotune``: the decisions table per model kind, ``--check``, ``--doctor``, one
family in detail (``--explain``, ``--trace``, ``--max-batch``) and the progress display.

Output is decided here; the logic is the library's, each name imported from the module that defines it: the
public API, and what it lacks (the cached measurements and decisions without measuring, the registered kinds,
``--doctor``'s findings, the words for a ratio, a time, an amount of memory). The arguments are parsed by
``autotune._args`` first, so ``python -m autotune`` starts its worker before this module loads torch. Errors
become a message on stderr and an exit code in one place: 0 ok, 1 failure, 2 usage, 3 ``--check`` recalibrated
a family.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune._answer import cached_configs, cached_families, demotions, similar_record
from autotune._answer import forget_demotion as forget
from autotune._args import parser
from autotune._cache.freshness import retry_at
from autotune._cache.lookup import cache_problem, clear_cache, export_results, import_results
from autotune._cache.loops import of as loops_of
from autotune._config import best_config
from autotune._decide import picked
from autotune._decision import Decision
from autotune._env import check_all as check_settings
from autotune._errors import AutotuneError, CalibrationError, UnknownFamilyError
from autotune._families import builtin_family_names, family_names, register_family
from autotune._fingerprint import fingerprint
from autotune._records import FP32_CPU, Candidate, CandidateResult, FamilyResult, Prefer, Rival
from autotune._version import __version__
from autotune._wording import (
    demotion_words,
    loop_words,
    mib_words,
    qualifiers,
    ratio_words,
    retry_words,
    time_words,
    times_over,
)
from autotune.backends import diagnose

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from autotune._calibrate import CalibrationProgress


def main(argv: Sequence[str] | None = None) -> int:
    command_line = parser(__version__)
    args = command_line.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        command_line.error("--steps must be a positive integer")
    if args.trace is None and (args.out is not None or args.candidate is not None):
        command_line.error("--out and --candidate go with --trace")
    if args.max_batch is None and (args.memory_limit_mb is not None or args.margin != 0.15):
        command_line.error("--memory-limit-mb and --margin go with --max-batch")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="autotune: %(message)s", stream=sys.stderr
    )
    logging.getLogger("filelock").setLevel(logging.WARNING)
    try:
        check_settings()  # a wrong AUTOTUNE_* value is answered before anything is measured
        if not args.doctor and (problem := cache_problem()) is not None:
            print(f"autotune: error: cannot use the cache directory: {problem}; nothing would be stored",
                  file=sys.stderr)
            return 1
        if args.clear:
            removed = clear_cache()
            print(f"removed {len(removed)} file(s)", file=sys.stderr)
            return 0
        if args.forget_demotion:
            return forget_demotion(args.forget_demotion)
        if args.doctor:
            return _doctor(args)
        if args.check:
            return _check(args)
        if args.export:
            kinds = [_register(value) for value in args.family] if args.family else None
            count = export_results(args.export, kinds)
            print(f"exported {count} record(s) to {args.export}", file=sys.stderr)
            return 0
        if args.import_file:
            summary = import_results(args.import_file)
            kept = f"; kept {len(summary.kept)} measured here" if summary.kept else ""
            print(f"imported {len(summary.imported)} record(s) from {args.import_file}{kept}", file=sys.stderr)
            return 0
        if args.explain:
            return explain(_register(args.explain), recalibrate=args.recalibrate, as_json=args.json,
                           prefer=args.prefer, steps=args.steps)
        if args.trace:
            return trace(_register(args.trace), args)
        if args.max_batch:
            return max_batch(_register(args.max_batch), args)
        return _decisions(args)
    except AutotuneError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        if isinstance(exc, UnknownFamilyError):
            print("autotune: your own model kind: --family NAME=package.module:function (also --explain, --trace)",
                  file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autotune: interrupted; nothing was stored for the family in progress", file=sys.stderr)
        return 1


def _register(value: str) -> str:
    """``NAME`` as is; ``NAME=package.module:function`` registered for this run first. Returns the name.

    A name alone need not be registered here while its measurements are cached (an app registered and measured
    it); measuring it needs its build, and an unknown name fails before anything is measured.
    """
    name, sep, ref = value.partition("=")
    if sep:
        register_family(name, ref)
    return name


def _decisions(args: argparse.Namespace) -> int:

    kinds = [_register(value) for value in args.family] if args.family else builtin_family_names()
    missing = set(kinds) - set(cached_families(kinds, fresh_only=True))
    if args.recalibrate or missing:
        measure = kinds if args.recalibrate else [k for k in kinds if k in missing]
        before = {kind: similar for kind in measure if (similar := similar_record(kind)) is not None}
        calibrate_with_progress(measure, force=args.recalibrate)
        for kind, similar in before.items():  # what changed since the same hardware was measured
            was = _pick_words(similar.result)
            now = _pick_words(cached_families([kind]).get(kind))
            change = f"the pick is still {now}" if was == now else f"the pick was {was}, now {now}"
            print(f"autotune: {kind}: {similar.then_and_now()}; {change}", file=sys.stderr)
    # Kinds registered here are decided as an app would see them; the others (an app registered and measured
    # them in its own process) from their cached measurements.
    registered = set(family_names())
    configs = {
        kind: best_config(kind, prefer=args.prefer, expected_steps=args.steps) if kind in registered
        else cached_configs([kind], prefer=args.prefer, expected_steps=args.steps)[kind]
        for kind in kinds
    }
    unusable = []
    if not args.family:  # every other kind the cache holds; one no candidate could train does not fail the table
        for kind in sorted(set(cached_families()) - set(configs)):
            try:
                configs[kind] = cached_configs([kind], prefer=args.prefer, expected_steps=args.steps)[kind]
            except CalibrationError:
                unusable.append(kind)
    fp = fingerprint()
    if args.json:
        print(strict_json({"fingerprint": fp, "configs": configs}))
        return 0

    out = console()
    out.print(f"[bold]Machine[/bold] {fp.summary()}  [dim](fingerprint {fp.digest})[/dim]")
    rows = list(configs.items())
    out.print(fitted(out, [
        Col("kind", [kind for kind, _ in rows]),
        Col("device", [c.device for _, c in rows]),
        Col("precision", [c.precision + (" [yellow](noisy)[/yellow]" if c.noisy else "") for _, c in rows]),
        Col("also", [", ".join(c.variants) or "-" for _, c in rows]),
        Col("step", [time_words(c.step_ms) if c.step_ms else "-" for _, c in rows], wraps=False),
        Col("vs fp32 CPU", [ratio_words(c.speedup_vs_fp32_cpu) if c.speedup_vs_fp32_cpu else "-" for _, c in rows]),
        Col("peak MiB", [mib(c.peak_memory_mb) for _, c in rows]),
        Col("source", [c.source for _, c in rows]),
    ], caption="vs fp32 CPU: per training step, the loop's data loading not in it"))
    for kind, config in configs.items():  # the evidence is --explain's
        out.print(f"[bold]{kind}[/bold]: {config.reason}", highlight=False)
    for kind in unusable:
        out.print(f"[bold]{kind}[/bold]: measured here, but no candidate could train it "
                  f"(python -m autotune --explain {kind})", highlight=False)
    return 0


def _check(args: argparse.Namespace) -> int:

    kinds = [_register(value) for value in args.family] if args.family else None
    from autotune._tools.canary import check_cached  # what measures loads only where a command measures

    results = check_cached(kinds)
    if args.json:
        print(strict_json(results))
    for r in results:
        line = f"{r.model_kind}: {r.verdict}: {r.detail}"
        if r.verdict == "recalibrated":
            line += f"; recalibrated: the pick is now {r.new_pick}" if r.new_pick != r.pick else \
                "; recalibrated: the pick is unchanged"
        print(f"autotune: {line} ({r.wall_s:.1f} s)", file=sys.stderr if args.json else sys.stdout)
    if not results:
        print("autotune: nothing measured here to check", file=sys.stderr)
    return 3 if any(r.verdict == "recalibrated" for r in results) else 0


def _pick_words(measured: FamilyResult | None) -> str:
    """e.g. ``'cpu bf16-mixed channels_last'``, or why there is none."""

    if measured is None:
        return "not measured"
    try:
        return picked(measured).label
    except CalibrationError:
        return "no usable candidate"


def _doctor(args: argparse.Namespace) -> int:

    findings = diagnose()
    if args.json:
        print(strict_json(findings))
    else:
        for finding in findings:
            print(f"[{finding.level}] {finding.message}")
            if finding.fix:
                print(f"        fix: {finding.fix}")
    return 0



def console() -> Console:
    """A rich console on stdout, as wide as the terminal or ``COLUMNS``; pipes and logs without ``COLUMNS`` get
    120 columns, not an 80-column squeeze."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 120)


@dataclass(frozen=True)
class Col:
    """One column of a :func:`fitted` table: its header, its cells (rich markup) and whether they wrap at spaces."""

    header: str
    cells: list[str]
    wraps: bool = True


def fitted(out: Console, columns: Sequence[Col], *, title: str | None = None, caption: str | None = None) -> Table:
    """A table as wide as its cells or the console, whichever is narrower, that never splits a word: a column
    whose cells are all ``-`` is left out, each column is at least as wide as its longest word (its longest cell
    where it does not wrap), and the room left goes to the columns whose cells wrap, as far as they need it."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    def plain(markup: str) -> str:
        return Text.from_markup(markup).plain

    shown = [c for c in columns if not c.cells or any(plain(cell) not in ("-", "") for cell in c.cells)]
    texts = [[plain(cell) for cell in c.cells] + [c.header] for c in shown]
    longest = [max(len(t) for t in found) for found in texts]
    least = [max(len(word) for t in found for word in t.split()) if c.wraps else widest
             for c, found, widest in zip(shown, texts, longest, strict=True)]
    room = out.width - 2 * (len(shown) - 1)  # a space of padding and one of the rule between two columns
    widths = list(least)
    while sum(widths) < room and any(w < most for w, most in zip(widths, longest, strict=True)):
        short = min((i for i, (w, most) in enumerate(zip(widths, longest, strict=True)) if w < most),
                    key=lambda i: widths[i] / longest[i])
        widths[short] += 1  # the column furthest from its widest cell first
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), title=title,
                  caption=caption)
    for column, width in zip(shown, widths, strict=True):
        table.add_column(column.header, width=width, no_wrap=not column.wraps, overflow="fold")
    for row in zip(*(c.cells for c in shown), strict=True):
        table.add_row(*row)
    return table



def calibrate_with_progress(kinds: list[str], *, force: bool) -> None:
    from autotune._background import calibrate  # the calibration machinery: only where the table misses

    if not sys.stderr.isatty():
        calibrate(kinds, force=force, progress=plain_progress())
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("calibrating", total=1.0)

        def update(p: CalibrationProgress) -> None:
            bar.update(task, completed=p.fraction, description=f"calibrating {p.family} {p.candidate or ''}")

        calibrate(kinds, force=force, progress=update)


def plain_progress() -> Callable[[CalibrationProgress], None]:
    """One line per family and candidate on stderr, for logs and pipes."""
    seen: set[tuple[str, str | None]] = set()

    def report(p: CalibrationProgress) -> None:
        key = (p.family, p.candidate)
        if key not in seen and p.candidate is not None:
            seen.add(key)
            print(f"autotune: [{100 * p.fraction:3.0f}%] {p.family}: {p.candidate}", file=sys.stderr)

    return report


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
        Col("step", [time_words(r.timing.median_ms) if r.timing else
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
    "failed; step: median step time (in parentheses: its first step only); rounds: R x S, R interleaved rounds of "
    "S steps each; vs fp32 CPU: its step time over fp32 on the CPU's (an interval: timed in the same rounds; "
    "~: from medians of other rounds); set-up: device, model and first step; peak MiB: the most memory its steps "
    "held (of what the allocator reserved); numerics: the largest relative loss error against fp32 on the CPU, "
    "then the cosine of its parameter update with fp32's")
EVIDENCE_LEGEND = (
    "verdict: slower; tie (not faster by its margin: the simpler one wins); faster (the preference or "
    "AUTOTUNE_DEVICE chose the pick); finishes later (its set-up outweighs its faster steps for --steps); dropped "
    "or outpaced (a search stage found it, or its device, clearly slower); unpaired (never timed in the same "
    "rounds); failed; time ratio: its step time over the pick's, or over what it was dropped or outpaced "
    "against; interval: the 95% interval of that ratio; rounds: the paired rounds behind it; against / why: what "
    "the ratio is against, and why it lost")


def forget_demotion(kind: str) -> int:

    try:
        undone = forget(kind)
    except OSError as exc:
        print(f"autotune: {exc}", file=sys.stderr)
        return 1
    for demotion in undone:
        print(f"autotune: undone: {demotion_words(demotion)}", file=sys.stderr)
    if not undone:
        print(f"autotune: nothing demoted for {kind} on this machine", file=sys.stderr)
    return 0


def trace(kind: str, args: argparse.Namespace) -> int:

    if args.recalibrate or kind not in cached_families([kind]):
        calibrate_with_progress([kind], force=args.recalibrate)
    from autotune._tools.trace import trace as trace_kind

    report = trace_kind(kind, out_dir=args.out or ".", candidate=args.candidate)
    if args.json:
        print(report.model_dump_json(indent=1))
        return 0

    out = console()
    on_device = report.device_activity is not None
    out.print(f"[bold]{kind}[/bold] on {report.candidate.label}: {report.steps} steps traced after "
              f"{report.warmup_steps} warm-up steps, {report.step_ms:.3g} ms/step under the profiler",
              highlight=False)
    ops = report.operators
    own = [op.self_device_ms if op.self_device_ms is not None else op.self_cpu_ms for op in ops]
    shares = [f"{100 * ms / report.self_total_ms:.0f}%" if report.self_total_ms > 0 else "-" for ms in own]
    table = fitted(out, [
        Col("operator", [op.name for op in ops]),
        Col("calls", [f"{op.calls_per_step:g}" for op in ops], wraps=False),
        Col("self CPU ms", [f"{op.self_cpu_ms:.3g}" for op in ops], wraps=False),
        *([Col("self device ms", [f"{op.self_device_ms:.3g}" if op.self_device_ms is not None else "-" for op in ops],
               wraps=False)] if on_device else []),
        Col("share", shares, wraps=False),
    ], title=f"top operators by self {'device' if on_device else 'CPU'} time per step")
    out.print(table)
    if not on_device and report.candidate.device != "cpu":
        out.print(f"[dim]torch.profiler records no {report.candidate.device} kernels: CPU side only[/dim]")
    out.print(f"trace: {report.path}", highlight=False, soft_wrap=True)  # a path is copied whole: never wrapped
    out.print("[dim]open it in https://ui.perfetto.dev or chrome://tracing[/dim]")
    return 0


def max_batch(kind: str, args: argparse.Namespace) -> int:
    from autotune._tools.max_batch import max_batch_report

    report = max_batch_report(kind, margin=args.margin, memory_limit_mb=args.memory_limit_mb,
                                       force=args.recalibrate)
    if args.json:
        print(report.model_dump_json(indent=1))
        return 0


    out = console()
    capped = " (the search's upper bound)" if report.capped else ""
    out.print(f"[bold]{kind}[/bold] on {report.candidate.label}: batch [bold]{report.batch_size}[/bold] fits"
              f"{capped}, peak {mib_words(report.peak_bytes)} of a {mib_words(report.target_bytes)} target "
              f"({report.limit_from} {mib_words(report.limit_bytes)} less {report.margin:.0%})", highlight=False)
    if report.line is not None:
        out.print(f"memory ~ {report.line.describe()}", highlight=False)
    probes = report.probes
    table = fitted(out, [
        Col("batch", [str(probe.batch_size) for probe in probes], wraps=False),
        Col("peak MiB", [f"{p.peak_bytes / 2**20:.1f}" if p.peak_bytes is not None else "-" for p in probes],
            wraps=False),
        Col("outcome", [probe.outcome + (f": {probe.detail}" if probe.detail else "") for probe in probes]),
    ])
    out.print(table)
    out.print(f"[dim]measured {report.measured_at} in {report.wall_s:.1f} s; peaks are what training adds to "
              "the process (--recalibrate measures again)[/dim]", highlight=False)
    return 0


def strict_json(value: object) -> str:
    """Records (in lists and dicts) as strict JSON, as the files are written: a NaN or an unbounded interval is the
    string ``"NaN"`` / ``"Infinity"``, which every JSON parser reads."""
    from pydantic import BaseModel

    def plain(found: object) -> object:
        if isinstance(found, BaseModel):
            return json.loads(found.model_dump_json())
        if isinstance(found, dict):
            return {k: plain(v) for k, v in found.items()}
        if isinstance(found, (list, tuple)):
            return [plain(v) for v in found]
        return found

    return json.dumps(plain(value), indent=1, allow_nan=False)


def mib(peak_mb: float | None, reserved_mb: float | None = None) -> str:
    """e.g. ``'61.5'``, ``'812 of 1024'`` (of what the allocator reserved), or ``'-'`` where none was measured."""
    if peak_mb is None:
        return "-"
    return f"{peak_mb:.3g}" + (f" of {reserved_mb:.4g}" if reserved_mb is not None else "")


def vs_fp32_cpu(result: CandidateResult, measured: FamilyResult, config: Decision) -> str:
    """Its step time over fp32 on the CPU's, e.g. ``'0.55x (0.52-0.58)'`` where they were timed in the same rounds,
    ``'0.3x'`` from the decision's paired evidence (a chain of ratios to the pick), ``'~0.33x'`` from medians."""
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
    return f"~{ratio_words(timing.median_ms / baseline.timing.median_ms)}"


def timed_in(result: CandidateResult) -> str:
    """Where its timing comes from: ``'final'`` (the paired comparison), ``'stage 2'``, or ``'failed'`` (its kind and
    detail follow the table)."""
    if result.failure is not None:
        return "failed"
    if result.timing is None:
        return "-"
    return "final" if result.timing.final else f"stage {result.timing.stage}"




if __name__ == "__main__":
    sys.exit(main())
