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
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from autotune._answer import best_config, cached_configs, cached_families, demotions, similar_record
from autotune._answer import forget_demotion as forget
from autotune._args import parser
from autotune._cache.freshness import retry_at
from autotune._cache.lookup import clear_cache, export_results, import_results
from autotune._calibrate import CalibrationProgress, calibrate
from autotune._config import Config
from autotune._decide import picked
from autotune._env import check_all as check_settings
from autotune._errors import AutotuneError, CalibrationError, UnknownFamilyError
from autotune._families import builtin_family_names, family_names, register_family
from autotune._fingerprint import fingerprint
from autotune._records import CandidateResult, FamilyResult, Prefer
from autotune._tools.canary import check_cached
from autotune._tools.max_batch import max_batch_report
from autotune._tools.trace import trace as trace_kind
from autotune._wording import demotion_words, mib_words, qualifiers, ratio_words, retry_words, time_words
from autotune.backends import diagnose

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser().error("--steps must be a positive integer")
    if args.trace is None and (args.out is not None or args.candidate is not None):
        parser().error("--out and --candidate go with --trace")
    if args.max_batch is None and (args.memory_limit_mb is not None or args.margin != 0.15):
        parser().error("--memory-limit-mb and --margin go with --max-batch")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="autotune: %(message)s", stream=sys.stderr
    )
    logging.getLogger("filelock").setLevel(logging.WARNING)
    try:
        check_settings()  # a wrong AUTOTUNE_* value is answered before anything is measured
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
        print(json.dumps({"fingerprint": fp.model_dump(mode="json"),
                          "configs": {k: c.model_dump(mode="json") for k, c in configs.items()}}, indent=1))
        return 0
    from rich.table import Table

    out = console()
    out.print(f"[bold]Machine[/bold] {fp.summary()}  [dim](fingerprint {fp.digest})[/dim]")
    table = Table()
    for column in ("kind", "device", "precision", "also", "step", "vs fp32 CPU", "peak MiB", "source"):
        table.add_column(column, overflow="fold")
    for kind, config in configs.items():
        speed = ratio_words(config.speedup_vs_fp32_cpu) if config.speedup_vs_fp32_cpu else "-"
        step = time_words(config.step_ms) if config.step_ms else "-"
        marker = " [yellow](noisy)[/yellow]" if config.noisy else ""
        table.add_row(kind, config.device, config.precision + marker, ", ".join(config.variants) or "-", step,
                      speed, mib(config.peak_memory_mb), config.source)
    out.print(table)
    for kind, config in configs.items():  # one line each, however narrow the console: the evidence is --explain's
        out.print(f"[bold]{kind}[/bold]: {config.reason}", highlight=False, soft_wrap=True)
    for kind in unusable:
        out.print(f"[bold]{kind}[/bold]: measured here, but no candidate could train it "
                  f"(python -m autotune --explain {kind})", highlight=False)
    return 0


def _check(args: argparse.Namespace) -> int:

    kinds = [_register(value) for value in args.family] if args.family else None
    results = check_cached(kinds)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in results], indent=1))
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
        print(json.dumps([f.model_dump() for f in findings], indent=1))
    else:
        for finding in findings:
            print(f"[{finding.level}] {finding.message}")
            if finding.fix:
                print(f"        fix: {finding.fix}")
    return 0



def console() -> Console:
    """A rich console on stdout; pipes and logs get 120 columns, not an 80-column squeeze."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)


def calibrate_with_progress(kinds: list[str], *, force: bool) -> None:
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
    if as_json:
        print(measured.model_dump_json(indent=1))
        return 0
    from rich.table import Table

    out = console()
    out.print(f"[bold]{kind}[/bold] measured {measured.measured_at} in {measured.wall_s:.1f} s"
              + ("  [yellow]noisy[/yellow]" if measured.noisy else ""))
    table = Table(title="measured")
    for column in ("candidate", "timed in", "step", "rounds", "time vs fp32 CPU", "set-up", "peak MiB", "loss err",
                   "update cos"):
        table.add_column(column, overflow="fold")
    for r in measured.candidates:
        t, n = r.timing, r.numerics
        table.add_row(
            r.candidate.label,
            timed_in(r),
            time_words(t.median_ms) if t else (f"{time_words(r.first_step_ms)} (1st)" if r.first_step_ms else "-"),
            f"{t.n} x {t.steps_per_round}" if t else "-",
            f"{ratio_words(t.vs_baseline.estimate)} ({t.vs_baseline.low:.2f}-{t.vs_baseline.high:.2f})"
            if t and t.vs_baseline else "-",
            time_words(1000 * r.setup_s) if r.setup_s is not None else "-",
            mib(r.peak_bytes / 2**20 if r.peak_bytes is not None else None,
                 r.peak_reserved_bytes / 2**20 if r.peak_reserved_bytes is not None else None),
            f"{n.loss_error:.1e}" if n else "-",
            f"{n.update_cosine:.3f}" if n else "-",
        )
    out.print(table)
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
    config = cached_configs([kind], prefer=prefer, expected_steps=steps)[kind]
    out.print(f"decision: {config.reason}", highlight=False, soft_wrap=True)
    if config.evidence is not None:
        out.print(evidence_table(config))
        for line in qualifiers(config.evidence, init_scale=config.init_scale):
            out.print(f"[dim]{line}[/dim]", highlight=False)
    return 0


def evidence_table(config: Config) -> Table:
    """Every other candidate against the pick: its verdict, time ratio (to the pick, or to the candidate it
    stopped against), interval and paired rounds, or its failure."""
    from rich.table import Table


    pick = config.candidate
    table = Table(title=f"against the pick, {pick.label}")
    for column in ("candidate", "verdict", "time ratio", "interval", "rounds"):
        table.add_column(column, no_wrap=True)  # one line per rival: what a reader scans for
    table.add_column("against / why", overflow="fold")
    for rival in config.evidence.rivals if config.evidence is not None else []:
        ratio = rival.ratio
        bounded = ratio is not None and ratio.high != float("inf") and not rival.far_behind
        against = "the pick" if rival.against == pick else rival.against.label if rival.against else ""
        why = f"{rival.failure.kind} (above)" if rival.failure else \
            f"{against}, far behind after one round" if rival.far_behind else \
            f"{against}, not faster by more than {rival.margin:.0%}" if rival.verdict == "tie" and rival.margin else \
            f"{against}, not confidently faster" if rival.verdict == "tie" else against
        table.add_row(rival.candidate.label, rival.verdict,
                      ratio_words(ratio.estimate) if ratio else "-",
                      f"{ratio.low:.2f}-{ratio.high:.2f}" if ratio and bounded else
                      "unpaired" if ratio and not rival.far_behind else "-",
                      str(rival.rounds) if rival.rounds is not None else "-", why)
    return table






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
    report = trace_kind(kind, out_dir=args.out or ".", candidate=args.candidate)
    if args.json:
        print(report.model_dump_json(indent=1))
        return 0
    from rich.table import Table

    out = console()
    on_device = report.device_activity is not None
    out.print(f"[bold]{kind}[/bold] on {report.candidate.label}: {report.steps} steps traced after "
              f"{report.warmup_steps} warm-up steps, {report.step_ms:.3g} ms/step under the profiler",
              highlight=False)
    table = Table(title=f"top operators by self {'device' if on_device else 'CPU'} time per step")
    for column in ("operator", "calls", "self CPU ms", *(["self device ms"] if on_device else []), "share"):
        table.add_column(column, overflow="fold")
    for op in report.operators:
        own = op.self_device_ms if op.self_device_ms is not None else op.self_cpu_ms
        share = f"{100 * own / report.self_total_ms:.0f}%" if report.self_total_ms > 0 else "-"
        device = [f"{op.self_device_ms:.3g}"] if op.self_device_ms is not None else []
        table.add_row(op.name, f"{op.calls_per_step:g}", f"{op.self_cpu_ms:.3g}", *device, share)
    out.print(table)
    if not on_device and report.candidate.device != "cpu":
        out.print(f"[dim]torch.profiler records no {report.candidate.device} kernels: CPU side only[/dim]")
    out.print(f"trace: {report.path}", highlight=False, soft_wrap=True)
    out.print("[dim]open it in https://ui.perfetto.dev or chrome://tracing[/dim]")
    return 0


def max_batch(kind: str, args: argparse.Namespace) -> int:
    report = max_batch_report(kind, margin=args.margin, memory_limit_mb=args.memory_limit_mb,
                                       force=args.recalibrate)
    if args.json:
        print(report.model_dump_json(indent=1))
        return 0
    from rich.table import Table


    out = console()
    capped = " (the search's upper bound)" if report.capped else ""
    out.print(f"[bold]{kind}[/bold] on {report.candidate.label}: batch [bold]{report.batch_size}[/bold] fits"
              f"{capped}, peak {mib_words(report.peak_bytes)} of a {mib_words(report.target_bytes)} target "
              f"({report.limit_from} {mib_words(report.limit_bytes)} less {report.margin:.0%})", highlight=False)
    if report.line is not None:
        out.print(f"memory ~ {report.line.describe()}", highlight=False)
    table = Table()
    for column in ("batch", "peak MiB", "outcome"):
        table.add_column(column, overflow="fold")
    for probe in report.probes:
        peak = f"{probe.peak_bytes / 2**20:.1f}" if probe.peak_bytes is not None else "-"
        table.add_row(str(probe.batch_size), peak, probe.outcome + (f": {probe.detail}" if probe.detail else ""))
    out.print(table)
    out.print(f"[dim]measured {report.measured_at} in {report.wall_s:.1f} s; peaks are what training adds to "
              "the process (--recalibrate measures again)[/dim]", highlight=False)
    return 0


def mib(peak_mb: float | None, reserved_mb: float | None = None) -> str:
    """e.g. ``'61.5'``, ``'812 (1024 reserved)'``, or ``'-'`` where no peak was measured."""
    if peak_mb is None:
        return "-"
    return f"{peak_mb:.3g}" + (f" ({reserved_mb:.4g} reserved)" if reserved_mb is not None else "")


def timed_in(result: CandidateResult) -> str:
    """Where its timing comes from: ``'final'`` (the paired comparison), ``'stage 2'``, or its failure's kind."""
    if result.failure is not None:
        return result.failure.kind
    if result.timing is None:
        return "-"
    return "final" if result.timing.final else f"stage {result.timing.stage}"




if __name__ == "__main__":
    sys.exit(main())
