"""Per-family records, a corrupt-file suite, links and permissions.

Each variant damages a results file holding two families the way a crash, a disk, another version or another
user could, and checks: no exception, a WARNING, the damage set aside (or left alone), the untouched family
still served, and the next save sound. Pruning and what other writers leave: test_store_pruning.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from samples import family, measured, saved_store, timed

import autotune
from autotune._cache.store import SCHEMA_VERSION, Store

Mutation = Callable[[Path], None]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return saved_store(tmp_path / "store")


def _edit(change: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(path: Path) -> None:
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document))
    return mutate


def _write(content: bytes) -> Mutation:
    return lambda path: path.write_bytes(content)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _hundred_mb(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(100 * 2**20)  # sparse: 100 MB to the reader, no disk used


def _deeply_nested(path: Path) -> None:
    path.write_text('{"schema_version": 1, "families": ' + "[" * 200_000 + "]" * 200_000 + "}")


def _symlink(path: Path) -> None:
    real = path.with_name("elsewhere.data")
    os.replace(path, real)
    path.symlink_to(real)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _cnn(change: Callable[[dict[str, Any]], None]) -> Mutation:
    return _edit(lambda document: change(document["families"]["cnn"]))


def _unknown_precision(cnn: dict[str, Any]) -> None:
    cnn["candidates"][1]["candidate"]["precision"] = "fp8-mixed"  # added by a newer version, same schema


def _wrong_types(cnn: dict[str, Any]) -> None:
    cnn["candidates"] = "two of them"


def _truncated_record(cnn: dict[str, Any]) -> None:
    del cnn["candidates"]


def _nan_median(cnn: dict[str, Any]) -> None:
    cnn["candidates"][0]["timing"]["median_ms"] = float("nan")  # json.dumps writes NaN


def _nan_loss_is_fine(cnn: dict[str, Any]) -> None:
    cnn["candidates"][1]["numerics"]["losses"] = [float("nan")]  # a failed candidate's trajectory may hold NaN


# outcome: "quarantined" (file moved to *.corrupt-*), "set-aside" (one family), "kept" (left untouched,
# answers from memory), "fine" (nothing wrong)
VARIANTS: dict[str, tuple[Mutation, str]] = {
    "truncated": (_truncate, "quarantined"),
    "binary-garbage": (_write(bytes(range(256)) * 4), "quarantined"),
    "100-mb-file": (_hundred_mb, "quarantined"),
    "deeply-nested-json": (_deeply_nested, "quarantined"),
    "wrong-types-top-level": (_edit(lambda d: d.update(families=["cnn", "mlp"])), "quarantined"),
    "fingerprint-wrong-type": (_edit(lambda d: d.update(fingerprint="a laptop")), "quarantined"),
    "not-an-object": (_write(b"[1, 2, 3]"), "quarantined"),
    "empty": (_write(b""), "quarantined"),
    "older-schema": (_edit(lambda d: d.update(schema_version=0)), "quarantined"),
    "future-schema": (_edit(lambda d: d.update(schema_version=SCHEMA_VERSION + 1)), "kept"),
    "unknown-value-in-one-family": (_cnn(_unknown_precision), "set-aside"),
    "wrong-types-in-one-family": (_cnn(_wrong_types), "set-aside"),
    "truncated-record-in-one-family": (_cnn(_truncated_record), "set-aside"),
    "nan-where-a-number-belongs": (_cnn(_nan_median), "set-aside"),
    "record-under-another-name": (_cnn(lambda cnn: cnn.update(model_kind="mlp")), "set-aside"),
    "nan-loss-of-a-candidate": (_cnn(_nan_loss_is_fine), "fine"),
    "symlink": (_symlink, "kept"),
    "directory-in-its-place": (_directory, "kept"),
    "named-pipe-in-its-place": (_fifo, "kept"),
}


#: links and named pipes need POSIX (unprivileged Windows cannot create symlinks; it has no mkfifo)
_POSIX_ONLY = pytest.mark.skipif(os.name != "posix", reason="needs symlinks and named pipes")


@pytest.mark.parametrize(
    "variant",
    [pytest.param(v, marks=_POSIX_ONLY) if v in ("symlink", "named-pipe-in-its-place") else v for v in VARIANTS],
)
def test_corrupt_file_suite(store: Store, variant: str, caplog: pytest.LogCaptureFixture) -> None:
    mutate, outcome = VARIANTS[variant]
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    mutate(path)
    before = os.lstat(path)
    fresh = Store(store.root)  # another process: nothing in memory
    with caplog.at_level(logging.WARNING, logger="autotune"):
        loaded = fresh.load(fp.digest)
        served = set(loaded.families) if loaded is not None else set()
        saved = fresh.save(fp, cnn := measured("cnn"))  # the damaged family measured again
    warnings = [r.getMessage() for r in caplog.records if r.name == "autotune" and r.levelno >= logging.WARNING]
    assert saved.families["cnn"] == cnn
    quarantined = sorted(p.name for p in store.root.glob("*.corrupt-*"))
    if outcome == "fine":
        assert served == {"cnn", "mlp"} and warnings == [] and quarantined == []
    elif outcome == "set-aside":
        assert served == {"mlp"}, "the untouched family is still served"
        assert any("'cnn'" in w and "(they are set aside then)" in w for w in warnings)
        assert quarantined == [f"{path.name}.cnn.corrupt-" + quarantined[0].rsplit(".corrupt-", 1)[1]]
        kept = Store(store.root).load(fp.digest)
        assert kept is not None and set(kept.families) == {"cnn", "mlp"} and kept.families["cnn"] == cnn
    elif outcome == "quarantined":
        assert served == set()
        assert any("was corrupt" in w for w in warnings)
        assert len(quarantined) == 1 and quarantined[0].startswith(f"{path.name}.corrupt-")
        written = Store(store.root).load(fp.digest)
        assert written is not None and set(written.families) == {"cnn"}
    else:  # kept: never overwritten, answered from memory
        assert outcome == "kept"
        assert served == set() and warnings
        assert quarantined == []
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (before.st_ino, before.st_mode, before.st_mtime_ns)
        assert fresh.load(fp.digest) == saved
    assert list(store.root.glob(".*.tmp")) == []


def test_permission_denied_is_read_nowhere_and_never_overwritten(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Tests run as root, where chmod 000 does not bite: the OS boundary (os.open of this one path) refuses.
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    content = path.read_bytes()
    real_open = os.open

    def denied(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(file) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    fresh = Store(store.root)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert fresh.load(fp.digest) is None
        saved = fresh.save(fp, cnn := measured("cnn"))
    assert "Permission denied" in caplog.text and "keeping results in memory" in caplog.text
    monkeypatch.undo()
    assert path.read_bytes() == content
    assert saved.families["cnn"] == cnn and fresh.load(fp.digest) is not None


def test_a_read_error_never_leads_to_overwriting(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    content = path.read_bytes()
    real_read = os.read

    def failing(fd: int, n: int) -> bytes:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            raise OSError(errno.EIO, "Input/output error")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", failing)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        saved = Store(store.root).save(fp, measured("transformer"))
    monkeypatch.undo()
    assert "Input/output error" in caplog.text
    assert path.read_bytes() == content, "cnn and mlp were not lost to a transient read error"
    assert set(saved.families) == {"transformer"}  # served from memory in this process


def test_fields_this_version_does_not_know_survive_a_save(store: Store) -> None:
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    document = json.loads(path.read_text())
    document["written_by"] = {"autotune": "9.0", "extras": [1, 2]}
    document["families"]["mlp"]["energy_j"] = 12.5
    document["families"]["mlp"]["candidates"][0]["candidate"]["graph_mode"] = "captured"
    path.write_text(json.dumps(document))
    Store(store.root).save(fp, measured("cnn"))
    after = json.loads(path.read_text())
    assert after["written_by"] == {"autotune": "9.0", "extras": [1, 2]}
    assert after["families"]["mlp"] == document["families"]["mlp"]


def test_a_planted_symlink_lock_is_refused_and_results_stay_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "store")
    fp = autotune.fingerprint()
    store.root.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    Path(f"{store.path(fp.digest)}.lock").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        saved = store.save(fp, cnn := measured("cnn"))
    assert "symbolic link" in caplog.text and "keeping results in memory" in caplog.text
    assert victim.read_text() == "keep me" and not store.path(fp.digest).exists()
    assert saved.families["cnn"] == cnn and store.load(fp.digest) == saved


def test_a_planted_symlink_calibration_lock_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (store.root / "abc.cnn.calibrating.lock").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert store.calibration_lock("abc", "cnn") is None
    assert "symbolic link" in caplog.text and victim.read_text() == "keep me"


def test_the_cache_directory_is_created_private(tmp_path: Path) -> None:
    store = Store(tmp_path / "a" / "cache")
    store.save(autotune.fingerprint(), measured("cnn"))
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=["world-writable", "group-writable", "sticky-tmp-like"])
def test_a_results_directory_writable_by_others_is_refused(
    store: Store, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    content = path.read_bytes()
    os.chmod(store.root, mode)
    fresh = Store(store.root)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert fresh.load(fp.digest) is None  # another user could have planted it
        saved = fresh.save(fp, cnn := measured("cnn"))
    assert "writable by other users" in caplog.text
    assert path.read_bytes() == content
    assert saved.families["cnn"] == cnn and fresh.load(fp.digest) == saved


def test_a_cache_directory_that_is_a_file_is_named_as_such_with_what_to_do(
    tiny_family: str, isolated_autotune: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    isolated_autotune.write_text("not a directory")
    advice = f"{isolated_autotune} is a file, not a directory: move the file away, or point AUTOTUNE_CACHE_DIR at a " \
        "directory of your own"
    with caplog.at_level(logging.WARNING, logger="autotune"):
        config = autotune.best_config(tiny_family, wait=False)
    assert config.reason.endswith("(the cache directory cannot be used, wait=False never measures)")
    assert advice in caplog.text and "calibrating" not in caplog.text  # nothing calibrates here
    from autotune._cli import main

    assert main(["--family", tiny_family]) == 1  # at once: a calibration would be lost with the process
    assert capsys.readouterr().err == f"autotune: error: cannot use the cache directory: {advice}; nothing would be " \
        "stored\n"


def test_a_cache_directory_writable_by_others_says_so_and_how_to_fix_it(
    tiny_family: str, isolated_autotune: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Store(isolated_autotune).save(autotune.fingerprint(), family(tiny_family, timed("cpu", "fp32", 10.0)))
    os.chmod(isolated_autotune, 0o777)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        config = autotune.best_config(tiny_family, wait=False)
    assert config.source == "heuristic" and "the cache directory cannot be used" in config.reason
    assert f"{isolated_autotune} is writable by other users (mode 777), who could plant files there that autotune " \
        f"would trust: chmod 700 {isolated_autotune}" in caplog.text


def test_a_family_saved_only_in_memory_is_still_served_next_to_the_file(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = autotune.fingerprint()

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    store.save(fp, measured("transformer"))
    monkeypatch.undo()
    loaded = store.load(fp.digest)
    assert loaded is not None and set(loaded.families) == {"cnn", "mlp", "transformer"}
