"""The command line's output: a console as wide as the terminal, tables that fit it, the progress display of a
calibration, and records as strict JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from autotune._calibrate import CalibrationProgress


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


__all__ = ["Col", "calibrate_with_progress", "console", "fitted", "mib", "plain_progress", "strict_json"]
