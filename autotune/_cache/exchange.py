"""Results an app can ship or share: export, import (untrusted input) and a read-only defaults layer.

An export file holds whole results files (each with its fingerprint), so a reader knows exactly which machine
configuration measured what. Reading one trusts nothing: the size is capped before parsing, every string in it is
made printable (``_disk.load_json``), the content is validated by the store's own pydantic models (no pickle, no
eval), names that end up in file names are checked, and every record is validated before the first one is written.
Where a record came from is the file's name as the user gave it ("imported from results.json", "shipped in
defaults.json"), never what the file says of itself. Writing goes through the store's locked, atomic save, one
results file at a time; a family this machine measured itself is never replaced.

The defaults layer (``AUTOTUNE_DEFAULTS=FILE`` or :func:`use_defaults`) is an export file shipped with an app
and never written: a record whose fingerprint matches this machine exactly serves as measured when the user's
cache has none, and the others can serve as similar-machine fallbacks.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from autotune._cache import disk as _disk
from autotune._cache.store import SCHEMA_VERSION, Store, StoreFile, write_atomic
from autotune._env import DEFAULTS
from autotune._errors import ImportFileError
from autotune._records import FamilyResult, Record
from autotune._version import __version__
from autotune._wording import printable

log = logging.getLogger("autotune")

#: an export of every built-in family on a dozen machine configurations is well under 1 MiB
MAX_BYTES = 16 * 2**20
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class ExportFile(Record):
    """What ``python -m autotune --export`` writes: results files, each with the fingerprint that measured it."""

    format: Literal["autotune-results"] = "autotune-results"
    schema_version: int
    autotune_version: str
    exported_at: str
    files: list[StoreFile]


class ImportSummary(Record):
    """What ``import_results`` did: ``imported`` and ``kept`` (measured here already) as ``(digest, kind)``."""

    imported: list[tuple[str, str]]
    kept: list[tuple[str, str]]


def export_results(store: Store, path: Path, kinds: Iterable[str] | None = None) -> ExportFile:
    """Write every stored results file (only ``kinds`` if given) to ``path`` atomically; returns what was written."""
    wanted = set(kinds) if kinds is not None else None
    files = []
    for stored in store.all_files():
        families = {k: r for k, r in stored.families.items() if wanted is None or k in wanted}
        if families:
            files.append(stored.model_copy(update={"families": families}))
    export = ExportFile(schema_version=SCHEMA_VERSION, autotune_version=__version__,
                        exported_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), files=files)
    data = export.model_dump_json(indent=1).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return export


def read_export(path: Path) -> ExportFile:
    """Read and validate an export file as untrusted input; raises :class:`ImportFileError` naming the problem."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ImportFileError(str(path), f"cannot read it ({exc.strerror or exc})", unreadable=True) from exc
    if len(raw) > MAX_BYTES:
        raise ImportFileError(str(path), f"it is larger than {MAX_BYTES // 2**20} MiB, far more than results take")
    try:
        export = ExportFile.model_validate(_disk.load_json(raw))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        raise ImportFileError(str(path), "not a valid autotune results file (truncated or not JSON)") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the top level"
        raise ImportFileError(str(path), f"not a valid autotune results file ({where}: {first['msg']})") from exc
    if export.schema_version != SCHEMA_VERSION:
        raise ImportFileError(str(path), f"written with results schema {export.schema_version}; this autotune "
                              f"reads schema {SCHEMA_VERSION}")
    for stored in export.files:
        if stored.schema_version != SCHEMA_VERSION:
            raise ImportFileError(str(path), f"a results file in it has schema {stored.schema_version}")
        for kind, result in stored.families.items():
            if not _KIND.fullmatch(kind) or result.model_kind != kind:
                raise ImportFileError(str(path), f"invalid model kind name {kind[:100]!r}")
    return export


def import_results(store: Store, path: Path) -> ImportSummary:
    """Merge an export file into ``store``; families measured here already are kept (local results win)."""
    export = read_export(path)  # everything validated before the first write
    origin = f"imported from {printable(path.name)} (exported {export.exported_at[:10]})"
    imported: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    for stored in export.files:
        digest = stored.fingerprint.digest
        for kind, result in stored.families.items():
            local = store.load(digest)
            mine = local.families.get(kind) if local is not None else None
            if mine is not None and mine.origin is None:
                kept.append((digest, kind))
                continue
            store.save(stored.fingerprint, result.model_copy(update={"origin": origin}))
            imported.append((digest, kind))
    log.info("imported %d record(s) from %s; kept %d measured here", len(imported), path, len(kept))
    return ImportSummary(imported=imported, kept=kept)


# The defaults layer: "unset" means AUTOTUNE_DEFAULTS decides; use_defaults() overrides it (None: no defaults).
_override: list[Path | None] = []
_loaded: dict[tuple[str, int, int], list[StoreFile]] = {}


def use_defaults(path: str | Path | None) -> None:
    """Layer the results file ``path`` (an export shipped with the app) under the user's cache, read-only.

    Validated now (raises :class:`ImportFileError` for a bad file); ``None`` turns the layer off, including
    ``AUTOTUNE_DEFAULTS``. Local measurements always win over it.
    """
    resolved = Path(path).expanduser() if path is not None else None
    if resolved is not None:
        _load(resolved)
    _override[:] = [resolved]


def defaults_files() -> list[StoreFile]:
    """The defaults layer's results files, each family marked with where it came from; [] without one."""
    path = _override[0] if _override else DEFAULTS.get()
    return _load(path) if path is not None else []


def defaults_record(digest: str, kind: str) -> FamilyResult | None:
    """The defaults layer's record of ``kind`` measured on exactly this machine configuration, if any."""
    for stored in defaults_files():
        if stored.fingerprint.digest == digest and kind in stored.families:
            return stored.families[kind]
    return None


def _load(path: Path) -> list[StoreFile]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ImportFileError(str(path), f"cannot read it ({exc.strerror or exc}); set by AUTOTUNE_DEFAULTS "
                              "or use_defaults()", unreadable=True) from exc
    key = (str(path), st.st_mtime_ns, st.st_size)
    files = _loaded.get(key)
    if files is None:
        origin = f"shipped in {printable(path.name)}"
        files = [stored.model_copy(update={"families": {
            k: r.model_copy(update={"origin": origin}) for k, r in stored.families.items()}})
            for stored in read_export(path).files]
        _loaded.clear()
        _loaded[key] = files
    return files


def reset() -> None:
    """Forget ``use_defaults``: ``AUTOTUNE_DEFAULTS`` decides again."""
    _override.clear()
    _loaded.clear()


def layer_stamp() -> tuple[object, ...]:
    """Changes when the defaults layer does: part of the decision memo's key."""
    path = _override[0] if _override else DEFAULTS.get()
    if path is None:
        return ()
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return (str(path), st.st_mtime_ns, st.st_size)
    return (str(path),)


__all__ = ["MAX_BYTES", "ExportFile", "ImportSummary", "defaults_files", "defaults_record", "export_results",
           "import_results", "layer_stamp", "read_export", "reset", "use_defaults"]
