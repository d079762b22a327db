"""The content of a results file: judged as a whole, validated family by family, rendered back whole.

- A document that is not a results file at all (wrong types at the top, another schema) is judged so (it is moved
  aside whole, ``documents``); one written by a newer schema is never overwritten.
- Each family is validated on its own: a family this version cannot read (a value added by a newer version,
  wrong types, NaN where a measured number belongs) is listed with why, and the other families still serve.
- ``put`` replaces one family and ``render`` writes back everything as it was read, fields this version does not
  know included.
- Nothing read is executed: JSON validated by pydantic, no pickle, no eval; every string in it is made printable
  (``disk.load_json``) before anything can say it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from pydantic import Field, ValidationError

from autotune._fingerprint import Fingerprint
from autotune._records import FamilyResult, Record

SCHEMA_VERSION = 1


class StoreFile(Record):
    """The content of one results file: the families this version can serve."""

    schema_version: int
    fingerprint: Fingerprint
    families: dict[str, FamilyResult]
    note: str = Field(default="", description="free text, e.g. where a recorded fixture's numbers come from")


def judge(document: dict[str, Any]) -> str | None:
    """Why ``document`` (a JSON object of no newer schema) is not a results file, e.g. ``"schema 0, expected 1"``;
    None when it is."""
    if not isinstance(document.get("families"), dict):
        return "'families' is not an object"
    try:
        header = StoreFile.model_validate({**document, "families": {}})
    except ValidationError as exc:
        return _first_error(exc)
    if header.schema_version != SCHEMA_VERSION:
        return f"schema {header.schema_version}, expected {SCHEMA_VERSION}"
    return None


def families(document: dict[str, Any]) -> tuple[StoreFile, dict[str, str]]:
    """A results file's families this version can serve, and why each other one is set aside (family -> why)."""
    valid: dict[str, FamilyResult] = {}
    invalid: dict[str, str] = {}
    for name, record in document["families"].items():
        result, problem = validate_family(name, record)
        if result is not None:
            valid[name] = result
        else:
            invalid[name] = problem or "invalid"
    return StoreFile.model_validate({**document, "families": {}}).model_copy(update={"families": valid}), invalid


def validate_family(name: str, record: object) -> tuple[FamilyResult | None, str | None]:
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


def put(document: dict[str, Any], fingerprint: Fingerprint, result: FamilyResult) -> dict[str, Any]:
    """``document`` (``{}``: a new file) with ``result`` in its families; every other field as read."""
    families = dict(document.get("families") or {})
    families[result.model_kind] = json.loads(result.model_dump_json())  # Infinity as "Infinity": strict JSON
    return {**document, "fingerprint": document.get("fingerprint") or json.loads(fingerprint.model_dump_json()),
            "families": families}


def holds_newer(document: dict[str, Any], result: FamilyResult) -> bool:
    """Whether ``document`` holds a measurement of ``result``'s family taken after it."""
    record: Any = (document.get("families") or {}).get(result.model_kind)
    try:
        return dt.datetime.fromisoformat(record["measured_at"]) > dt.datetime.fromisoformat(result.measured_at)
    except (TypeError, KeyError, ValueError):  # no record, no time in it, or not a time: not newer
        return False


def render(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as a results file is written: its fields in their order, then what this version does not know
    as it was read."""
    rendered = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": document.get("fingerprint"),
        "families": document.get("families") or {},
        "note": document.get("note", ""),
    }
    rendered.update((k, v) for k, v in document.items() if k not in rendered)
    return rendered


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"[:200]


__all__ = ["SCHEMA_VERSION", "StoreFile", "families", "holds_newer", "judge", "put", "render", "validate_family"]
