"""The command line's arguments: parsed before anything heavy loads, so that ``python -m autotune`` can start its
calibration worker first (:func:`may_measure`); the rest of the command line is ``autotune._cli``. This module
imports nothing of autotune but the candidate's table (only the standard library), so its callers hand it the
package's version."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from autotune._variants import PREFERENCES

EPILOG = """\
examples:
  python -m autotune                       calibrate what is missing, show the decisions
  python -m autotune --recalibrate         measure again (after a GPU, driver or torch change)
  python -m autotune --family cnn --json   one model kind, machine-readable on stdout
  python -m autotune --explain cnn         every candidate: times, intervals, numerics, failures
  python -m autotune --trace cnn --out traces   profile the picked configuration: Chrome trace + top operators
  python -m autotune --trace cnn --candidate "cpu fp32"   ... or another measured candidate, to compare
  python -m autotune --family mine=my_app.models:build_model   your own model kind (also --explain, --trace)
  python -m autotune --prefer gpu --steps 60   decisions for a user who chose "GPU" and a short job
  python -m autotune --max-batch cnn        the largest batch that fits, with the fitted memory line
  python -m autotune --max-batch cnn --memory-limit-mb 4096   ... under 4 GiB of training memory
  python -m autotune --doctor              GPU hardware that this torch build cannot use, and what to do
  python -m autotune --export results.json   share or ship the results (with --family: only those kinds)
  python -m autotune --import results.json   merge results measured elsewhere (files are checked, never run)
  python -m autotune --check               re-time each cached pick (cheap); recalibrate if it no longer wins
  python -m autotune --forget-demotion cnn   undo what a training run's guard demoted for cnn on this machine
  python -m autotune --clear               delete the stored measurements (and demotions)

the table: also: the settings that won besides device and precision (memory format, optimizer kernels, CPU
threads); step: the median training step; vs fp32 CPU: how many times faster than fp32 on the CPU, per training
step (the loop's data loading not in it); peak MiB: the most memory its measured steps held; source: measured,
forced (AUTOTUNE_DEVICE) or heuristic (nothing measured here; the line under the table says why). --explain
prints what its own columns mean. Output is as wide as the terminal, or COLUMNS when piped (default 120).

environment: AUTOTUNE_CACHE_DIR, AUTOTUNE_DEVICE, AUTOTUNE_ISOLATION, AUTOTUNE_WORKER_PYTHON,
AUTOTUNE_CANDIDATE_TIMEOUT_S, AUTOTUNE_LOCK_TIMEOUT_S, AUTOTUNE_RANKS_TIMEOUT_S, AUTOTUNE_RANKS_LOOP_TIMEOUT_S,
AUTOTUNE_BUDGET_S, AUTOTUNE_SEARCH, AUTOTUNE_DEFAULTS (docs/reference/environment.md)
"""


def parser(version: str) -> argparse.ArgumentParser:
    """The command line's parser; ``version`` is what ``--version`` prints after the name, e.g. ``'0.1.0'``."""
    parser = argparse.ArgumentParser(
        prog="python -m autotune",
        description="Measure which device and precision train each model kind fastest, correctly, on this machine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--family", action="append", metavar="NAME[=MODULE:FUNC]",
                        help="model kind (repeatable; default: built-ins and every kind measured here); "
                        "NAME=package.module:function registers your own for this run")
    parser.add_argument("--recalibrate", action="store_true", help="measure again even if results are cached")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout and nothing else there")
    parser.add_argument("--explain", metavar="NAME[=MODULE:FUNC]",
                        help="show every candidate measured for one model kind")
    parser.add_argument("--trace", metavar="NAME[=MODULE:FUNC]",
                        help="profile a few training steps of the picked configuration; write a Chrome trace")
    parser.add_argument("--out", metavar="DIR", help="where --trace writes its trace (default: the current directory)")
    parser.add_argument("--candidate", metavar="LABEL",
                        help="with --trace: a measured candidate instead of the pick, e.g. 'cpu fp32'")
    parser.add_argument("--prefer", choices=PREFERENCES, default="auto",
                        help="the user's device choice: gpu is any accelerator, cuda / mps / xpu that backend's")
    parser.add_argument("--steps", type=int, metavar="N", help="expected training steps (short jobs count set-up)")
    parser.add_argument("--export", metavar="FILE", help="write the stored results (with their fingerprints) to FILE")
    parser.add_argument("--import", dest="import_file", metavar="FILE",
                        help="merge results exported elsewhere into the cache (measured here wins)")
    parser.add_argument("--check", action="store_true",
                        help="re-time each cached pick against fp32 and the runner-up; recalibrate a family whose "
                        "pick no longer wins (exit 3)")
    parser.add_argument("--max-batch", metavar="NAME[=MODULE:FUNC]",
                        help="the largest batch of one model kind that fits on its picked device and precision")
    parser.add_argument("--memory-limit-mb", type=float, metavar="MIB",
                        help="with --max-batch: the memory training may take (default: the device's free memory)")
    parser.add_argument("--margin", type=float, default=0.15,
                        help="with --max-batch: share of the limit kept free (default 0.15)")
    parser.add_argument("--forget-demotion", metavar="NAME",
                        help="undo the demotions a training run's guard recorded for one model kind on this machine")
    parser.add_argument("--clear", action="store_true", help="delete all stored measurements and demotions and exit")
    parser.add_argument("--doctor", action="store_true", help="diagnose GPUs this torch build cannot use")
    parser.add_argument("-v", "--verbose", action="store_true", help="log decisions and calibration steps")
    parser.add_argument("--version", action="version", version=f"autotune {version} (torch-autotune-device)")
    return parser


def may_measure(version: str, argv: Sequence[str] | None = None) -> bool:
    """Whether these arguments may measure anything (``python -m autotune`` then starts its worker before it
    imports torch). A usage error, ``--help`` or ``--version`` exits here, as in ``autotune._cli.main``."""
    args = parser(version).parse_args(argv)
    return not (args.clear or args.doctor or args.export or args.import_file or args.forget_demotion)


__all__ = ["EPILOG", "may_measure", "parser"]
