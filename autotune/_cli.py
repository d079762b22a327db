"""``python -m autotune``: the decisions table per model kind, ``--check``, ``--doctor``, one
family in detail (``--explain``, ``--trace``, ``--max-batch``) and the progress display.

Output is decided here (``--explain`` in ``autotune._explain``, the tables and progress in ``autotune._console``);
the logic is the library's, each name imported from the module that defines it: the
public API, and what it lacks (the cached measurements and decisions without measuring, the registered kinds,
``--doctor``'s findings, the words for a ratio, a time, an amount of memory). The arguments are parsed by
``autotune._args`` first, so ``python -m autotune`` starts its worker before this module loads torch. Errors
become a message on stderr and an exit code in one place: 0 ok, 1 failure, 2 usage, 3 ``--check`` recalibrated
a family.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from autotune._answer import cached_configs, cached_families, similar_record
from autotune._answer import forget_demotion as forget
from autotune._args import parser
from autotune._cache.lookup import cache_problem, clear_cache, export_results, import_results
from autotune._config import best_config
from autotune._console import Col, calibrate_with_progress, console, fitted, mib, strict_json
from autotune._decide import picked
from autotune._env import check_all as check_settings
from autotune._errors import AutotuneError, CalibrationError, UnknownFamilyError
from autotune._explain import explain
from autotune._families import builtin_family_names, family_names, register_family
from autotune._fingerprint import fingerprint
from autotune._loop_wording import demotion_words
from autotune._records import FamilyResult
from autotune._variants import CPU
from autotune._version import __version__
from autotune._wording import mib_words, ratio_words, time_words
from autotune.backends import diagnose


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
    from autotune._tools.check import check_cached  # what measures loads only where a command measures

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
    if not on_device and report.candidate.device != CPU:
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


if __name__ == "__main__":
    sys.exit(main())
