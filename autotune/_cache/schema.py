"""The content of a results file: parsed from bytes, validated family by family, rendered back whole.

- A file that is not a results file at all (not JSON, nested thousands deep, wrong types at the top, another
  schema) is :class:`Unreadable`; one written by a newer schema is :class:`Newer` (never overwritten).
- Each family is validated on its own: a family this version cannot read (a value added by a newer version,
  wrong types, NaN where a measured number belongs) is listed with why, and the other families still serve.
- ``render`` writes back everything as it was read, fields this version does not know included, with one
  family replaced.
- Nothing read is executed: JSON validated by pydantic, no pickle, no eval; every string in it is made printable
  (``disk.load_json``) before anything can say it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from autotune._cache import disk as _disk
from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult, Record

SCHEMA_VERSION = 1


class StoreFile(Record):
    """The content of one results file: the families this version can serve."""

    schema_version: int
    fingerprint: Fingerprint
    families: dict[str, FamilyResult]
    note: str = Field(default="", description="free text, e.g. where a recorded fixture's numbers come from")


@dataclass(frozen=True)
class Parsed:
    """One results file as read: ``document`` is written back as is, unknown fields included."""

    document: dict[str, Any]
    valid: StoreFile
    #: family -> why it is set aside
    invalid: dict[str, str]


@dataclass(frozen=True)
class Unreadable:
    """Not a results file this version can read at all: why (it is quarantined whole)."""

    reason: str


@dataclass(frozen=True)
class Newer:
    """Written by a newer schema: left untouched."""

    schema_version: int


def parse(raw: bytes) -> Parsed | Unreadable | Newer:
    """A results file's bytes, judged as a whole and family by family."""
    try:
        document = _disk.load_json(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        return Unreadable(f"not JSON: {str(exc)[:120] or type(exc).__name__}")
    if not isinstance(document, dict):
        return Unreadable(f"a JSON {type(document).__name__}, not an object")
    version = document.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return Newer(version)
    families = document.get("families")
    if not isinstance(families, dict):
        return Unreadable("'families' is not an object")
    try:
        header = StoreFile.model_validate({**document, "families": {}})
    except ValidationError as exc:
        return Unreadable(_first_error(exc))
    if header.schema_version != SCHEMA_VERSION:
        return Unreadable(f"schema {header.schema_version}, expected {SCHEMA_VERSION}")
    valid: dict[str, FamilyResult] = {}
    invalid: dict[str, str] = {}
    for name, record in families.items():
        result, problem = _validate_family(name, record)
        if result is not None:
            valid[name] = result
        else:
            invalid[name] = problem or "invalid"
    return Parsed(document, header.model_copy(update={"families": valid}), invalid)


def _validate_family(name: str, record: object) -> tuple[FamilyResult | None, str | None]:
    """The family's record validated on its own, or why it cannot be used."""
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    try:
        result = FamilyResult.model_validate(record)
    except ValidationError as exc:
        return None, _first_error(exc)
    except RecursionError:
        return None, "nested too deeply"
    if result.model_kind != name:
        return None, f"it is the record of {result.model_kind!r}"
    try:
        dt.datetime.fromisoformat(result.measured_at)
    except ValueError:
        return None, f"measured_at {result.measured_at[:40]!r} is not a time"
    nan = _nan_number(result)
    if nan is not None:
        return None, f"NaN in {nan}, where a measured number belongs"
    return result, None


def _nan_number(result: FamilyResult) -> str | None:
    """The first measured number the decision relies on that is NaN (losses of a failed candidate may be)."""
    numbers: list[tuple[str, float | None]] = [
        ("wall_s", result.wall_s), ("budget_s", result.budget_s), ("worker_start_s", result.worker_start_s),
        *((f"control_ms[{i}]", v) for i, v in enumerate(result.control_ms)),
    ]
    for r in result.candidates:
        label = r.candidate.label
        numbers += [(f"{label} setup_s", r.setup_s), (f"{label} first_step_ms", r.first_step_ms)]
        if r.timing is not None:
            t = r.timing
            numbers += [(f"{label} median_ms", t.median_ms), (f"{label} spread", t.spread)]
            numbers += [(f"{label} round_ms[{i}]", v) for i, v in enumerate(t.round_ms)]
            if t.vs_baseline is not None:
                b = t.vs_baseline
                numbers += [(f"{label} vs_baseline", v) for v in (b.estimate, b.low, b.high)]
    return next((where for where, value in numbers if value is not None and math.isnan(value)), None)


def render(document: dict[str, Any], fingerprint: Fingerprint, result: FamilyResult) -> bytes:
    """``document`` with ``result`` in its families; every other field is written back as read."""
    families = dict(document.get("families") or {})
    families[result.model_kind] = json.loads(result.model_dump_json())  # Infinity as "Infinity": strict JSON
    rendered = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": document.get("fingerprint") or json.loads(fingerprint.model_dump_json()),
        "families": families,
        "note": document.get("note", ""),
    }
    rendered.update((k, v) for k, v in document.items() if k not in rendered)
    return _disk.strict_json(rendered)


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"[:200]


__all__ = ["SCHEMA_VERSION", "Newer", "Parsed", "StoreFile", "Unreadable", "parse", "render"]
