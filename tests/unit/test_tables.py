"""A candidate is made of tables: the precisions, the variant axes and the ``prefer`` words live in
``autotune._variants``, each backend's names in its module, and the rest of the package reads the rows and the
backends instead of spelling their names."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest
import torch

from autotune import _variants
from autotune._apply.precision import AUTOCAST_DTYPES
from autotune._lab.verify import TOLERANCES
from autotune._records import PRECISIONS, Choice
from autotune._variants import AXES, CPU, PRECISION_ROWS, PREFERENCES, MemoryFormat, OptimizerImpl, Precision
from autotune.backends import all_backends

PACKAGE = Path(__file__).parents[2] / "autotune"

#: where the names may be spelled: the table (its prefer words name every backend, its CPU is the baseline's
#: device), and each backend (its own names, and what it supports)
TABLES = ("_variants.py", "backends/")
#: the names the table holds; "default" (an optimizer setting) is also a search's and a setting's word
NAMES = {
    "precision": set(get_args(Precision)),
    "axis": {axis.field for axis in AXES} | (set(get_args(MemoryFormat)) | set(get_args(OptimizerImpl))) - {"default"},
    "backend": {name for backend in all_backends()
                for name in (backend.name, backend.device_type, backend.lightning_accelerator) if name is not None},
}
#: (file, name) where the name is the subject itself, not a row of the table
EXCEPTIONS = {
    # torch's keyword of ``.to()`` that the layout axis sets, not the axis
    ("_apply/axes.py", "memory_format"),
    # the attribute and argument a framework's optimizer wrapper holds, not the optimizer axis
    ("_guard/replay.py", "optimizer"),
    ("_guard/watch.py", "optimizer"),
    # the simulated truths: a fused optimizer's GradScaler needs no sync; a recorded channels_last means 4-D inputs
    ("testing/truth.py", "fused"),
    ("testing/truth.py", "channels_last"),
    # the CPU in others' words: Accelerate's ``cpu=`` argument, /proc/stat's lines, cgroup v1's controller
    ("_frameworks/accelerate.py", "cpu"),
    ("_lab/load/_proc.py", "cpu"),
    ("_quota.py", "cpu"),
    # the fingerprint's field for the torch build's CUDA version, a key of the cache's format
    ("_fingerprint.py", "cuda"),
}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that stand alone as statements: docstrings, attribute docstrings."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _spelled(names: set[str]) -> set[tuple[str, str]]:
    """(file, name) for each string literal outside the tables and docstrings that is one of ``names``."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        if where.startswith(TABLES):
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        found |= {(where, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
                  and node.value in names and id(node) not in docstrings}
    return found


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_names_are_spelled_only_in_their_table(kind: str) -> None:
    # A name spelled elsewhere is a table of its own: a new precision or axis would be missed there.
    assert _spelled(NAMES[kind]) - EXCEPTIONS == set()


def test_every_exception_is_still_spelled_where_it_is_named() -> None:
    assert EXCEPTIONS <= _spelled(set().union(*NAMES.values()))


def test_the_precision_rows_are_the_precisions_simplest_first() -> None:
    assert tuple(row.name for row in PRECISION_ROWS) == get_args(Precision) == PRECISIONS
    assert [_variants.simplicity(name) for name in PRECISIONS] == list(range(len(PRECISIONS)))
    assert set(TOLERANCES) == set(PRECISIONS)


@pytest.mark.parametrize("row", PRECISION_ROWS, ids=lambda row: row.name)
def test_a_precision_row_says_how_it_runs(row: _variants.PrecisionRow) -> None:
    # Mixed precision is autocast's doing (the float32 math stays the app's); a GradScaler only with autocast.
    assert (row.autocast is None) == (row.fp32_math is not None)
    assert AUTOCAST_DTYPES[row.name] is (None if row.autocast is None else getattr(torch, row.autocast))
    assert not row.grad_scaler or row.autocast is not None


def test_a_choice_holds_the_device_the_precision_and_one_field_per_axis() -> None:
    assert list(Choice.model_fields) == ["device", "precision", *(axis.field for axis in AXES)]
    assert all(Choice.model_fields[axis.field].default == axis.default for axis in AXES)


def test_the_ranks_share_the_precision_and_the_shared_axes() -> None:
    assert _variants.SHARED_FIELDS == ("precision", "memory_format", "optimizer", "compiled")


def test_prefer_names_every_backend_after_auto_and_gpu() -> None:
    assert PREFERENCES == ("auto", "gpu", *(backend.name for backend in all_backends()))


def test_the_cpu_backend_is_named_after_the_tables_cpu() -> None:
    cpu = all_backends()[0]
    assert cpu.name == cpu.device_type == cpu.lightning_accelerator == CPU


def test_only_the_compiled_axis_compiles() -> None:
    assert _variants.compiles(Choice(device="cpu", precision="fp32", compiled=True))
    assert not _variants.compiles(Choice(device="cpu", precision="fp32", memory_format="channels_last"))
