"""``python -m autotune``'s views of one family in detail (``--explain``, ``--trace``, ``--max-batch``) and the
calibration progress every command shows while it measures."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from autotune._calibrate import CalibrationProgress
    from autotune._models import CandidateResult, FamilyResult


def console() -> Console:
    """A rich console on stdout; pipes and logs get 120 columns, not an 80-column squeeze."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)


def calibrate_with_progress(kinds: list[str], *, force: bool) -> None:
    import autotune

    if not sys.stderr.isatty():
        autotune.calibrate(kinds, force=force, progress=plain_progress())
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("calibrating", total=1.0)

        def update(p: autotune.CalibrationProgress) -> None:
            bar.update(task, completed=p.fraction, description=f"calibrating {p.family} {p.candidate or ''}")

        autotune.calibrate(kinds, force=force, progress=update)


def plain_progress() -> Callable[[CalibrationProgress], None]:
    """One line per family and candidate on stderr, for logs and pipes."""
    seen: set[tuple[str, str | None]] = set()

    def report(p: CalibrationProgress) -> None:
        key = (p.family, p.candidate)
        if key not in seen and p.candidate is not None:
            seen.add(key)
            print(f"autotune: [{100 * p.fraction:3.0f}%] {p.family}: {p.candidate}", file=sys.stderr)

    return report


def explain(kind: str, *, recalibrate: bool, as_json: bool) -> int:
    from autotune._api import cached_configs, cached_families
    from autotune._families import family_names

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
    table = Table()
    columns = ("candidate", "ms/step", "rounds", "time vs fp32 CPU", "set-up s", "peak MiB", "loss err", "update cos",
               "outcome")
    for column in columns:
        table.add_column(column, overflow="fold")
    for r in measured.candidates:
        t, n = r.timing, r.numerics
        table.add_row(
            r.candidate.label,
            f"{t.median_ms:.3g}" if t else (f"{r.first_step_ms:.3g} (1st)" if r.first_step_ms else "-"),
            f"{t.n} x {t.steps_per_round}" if t else "-",
            t.vs_baseline.describe() if t and t.vs_baseline else "-",
            f"{r.setup_s:.2f}" if r.setup_s is not None else "-",
            mib(r.peak_bytes / 2**20 if r.peak_bytes is not None else None,
                 r.peak_reserved_bytes / 2**20 if r.peak_reserved_bytes is not None else None),
            f"{n.loss_error:.1e}" if n else "-",
            f"{n.update_cosine:.3f}" if n else "-",
            outcome(r),
        )
    out.print(table)
    for r in measured.candidates:
        if r.failure is not None:
            out.print(f"{r.candidate.label} {r.failure.kind}: {retry_words(measured, r)}", highlight=False)
    for note in measured.search_notes:
        out.print(f"[dim]{note}[/dim]", highlight=False)
    for backend, why in measured.backend_notes.items():
        out.print(f"[dim]{backend}: {why}[/dim]")
    out.print(f"decision: {cached_configs([kind])[kind].reason}")
    return 0


def trace(kind: str, args: argparse.Namespace) -> int:
    import autotune
    from autotune._api import cached_families

    if args.recalibrate or kind not in cached_families([kind]):
        calibrate_with_progress([kind], force=args.recalibrate)
    report = autotune.trace(kind, out_dir=args.out or ".", candidate=args.candidate)
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
    import autotune

    report = autotune.max_batch_report(kind, margin=args.margin, memory_limit_mb=args.memory_limit_mb,
                                       force=args.recalibrate)
    if args.json:
        print(report.model_dump_json(indent=1))
        return 0
    from rich.table import Table

    from autotune._batch_search import mib_words

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


def outcome(result: CandidateResult) -> str:
    if result.failure is not None:
        return f"{result.failure.kind}: {result.failure.detail}"
    if result.timing is None:
        return "ok"
    stage = "final" if result.timing.final else f"stage {result.timing.stage}"
    if result.timing.dropped is not None:
        return f"{stage}: {result.timing.dropped.describe()}"
    return f"{stage}: finalist" if result.timing.final else f"{stage}: ok"


def retry_words(measured: FamilyResult, result: CandidateResult) -> str:
    """When this failure is measured again, e.g. 'retried after 2026-12-01 14:03 UTC'."""
    import datetime as dt

    from autotune._cache.freshness import retry_at

    at = retry_at(measured, result)
    if at is None:
        return "kept until the machine, the family or the search changes, or --recalibrate"
    if at <= dt.datetime.now(dt.timezone.utc):
        return "retried by the next calibration"
    return f"retried after {at.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, or at once with --recalibrate"
