from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
from samples import family, timed

import autotune
from autotune._cache.store import SCHEMA_VERSION, Store, StoreFile


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store")


def _result(kind: str = "cnn"):  # type: ignore[no-untyped-def]
    return family(kind, timed("cpu", "fp32", 100.0), timed("cpu", "bf16-mixed", 50.0))


def test_round_trip(store: Store) -> None:
    fp = autotune.fingerprint()
    result = _result()
    store.save(fp, result)
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None
    assert loaded.schema_version == SCHEMA_VERSION
    assert loaded.fingerprint == fp
    assert loaded.families["cnn"] == result


def test_file_is_human_readable_json(store: Store) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result())
    data = json.loads(store.path(fp.digest).read_text())
    candidate = data["families"]["cnn"]["candidates"][1]["candidate"]
    expected = ("cpu", "bf16-mixed", "contiguous")
    assert (candidate["device"], candidate["precision"], candidate["memory_format"]) == expected


def test_families_written_separately_are_merged(store: Store) -> None:
    fp = autotune.fingerprint()
    Store(store.root).save(fp, _result("cnn"))
    Store(store.root).save(fp, _result("mlp"))  # a second process knows nothing of the first's write
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None and set(loaded.families) == {"cnn", "mlp"}


CORRUPTIONS = {
    "garbage": b"\x00\xffnot json at all",
    "truncated": None,  # filled from a real file below
    "wrong-type": json.dumps({"schema_version": 1, "fingerprint": "x", "families": []}).encode(),
    "not-an-object": b"[1, 2, 3]",
    "empty": b"",
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_file_is_quarantined_with_one_warning(store: Store, kind: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result())
    path = store.path(fp.digest)
    content = CORRUPTIONS[kind]
    if content is None:
        content = path.read_bytes()[:-40]
    path.write_bytes(content)
    fresh = Store(store.root)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert fresh.load(fp.digest) is None
    assert len([r for r in caplog.records if r.name == "autotune"]) == 1
    assert "was corrupt" in caplog.text and "measured again when next asked for" in caplog.text
    assert not path.exists()
    quarantined = list(store.root.glob(f"{path.name}.corrupt-*"))
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == content
    # and it is written again cleanly
    fresh.save(fp, _result())
    assert Store(store.root).load(fp.digest) is not None


def test_saving_over_a_corrupt_file_quarantines_it_under_the_held_lock(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    fp = autotune.fingerprint()
    store.root.mkdir(parents=True)
    store.path(fp.digest).write_bytes(b"garbage written by something else")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        store.save(fp, result := _result())  # no load first: the corrupt file is met inside save's lock
    assert "could not be moved aside" not in caplog.text and "was corrupt" in caplog.text
    assert len(list(store.root.glob("*.corrupt-*"))) == 1
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None and loaded.families["cnn"] == result


def test_future_schema_is_ignored_and_never_overwritten(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    fp = autotune.fingerprint()
    store.root.mkdir(parents=True)
    future = json.dumps({"schema_version": SCHEMA_VERSION + 1, "anything": "new"}).encode()
    store.path(fp.digest).write_bytes(future)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert store.load(fp.digest) is None
        saved = store.save(fp, result := _result())
    assert "newer autotune" in caplog.text
    assert store.path(fp.digest).read_bytes() == future
    # the result is still served from memory in this process
    assert saved.families["cnn"] == result
    assert store.load(fp.digest) == saved


def test_disk_full_keeps_the_old_file_and_serves_from_memory(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result("cnn"))
    before = store.path(fp.digest).read_bytes()

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the store
    with caplog.at_level(logging.WARNING, logger="autotune"):
        store.save(fp, _result("mlp"))
    assert "No space left" in caplog.text and "keeping results in memory" in caplog.text
    assert store.path(fp.digest).read_bytes() == before
    assert list(store.root.glob("*.tmp")) == []
    loaded = store.load(fp.digest)
    assert loaded is not None and "cnn" in loaded.families


def test_unwritable_cache_dir_degrades_to_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    store = Store(blocker / "cache")  # mkdir under a regular file fails even for root
    fp = autotune.fingerprint()
    with caplog.at_level(logging.WARNING, logger="autotune"):
        store.save(fp, _result())
    assert "cannot write" in caplog.text
    assert store.load(fp.digest) is not None


def test_unbounded_intervals_survive_a_round_trip(store: Store) -> None:
    # A candidate dropped after one round has an unbounded interval; it must not corrupt the file.
    from autotune._records import Interval

    fp = autotune.fingerprint()
    result = _result()
    bf16 = result.candidates[1]
    timing = bf16.timing.model_copy(update={"vs_baseline": Interval(estimate=0.5, low=0.0, high=float("inf"))})
    unbounded = bf16.model_copy(update={"timing": timing})
    result = result.model_copy(update={"candidates": [result.candidates[0], unbounded]})
    store.save(fp, result)
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None and loaded.families["cnn"] == result
    # Strict JSON: every parser reads the file ("Infinity" is a string there).
    document = json.loads(store.path(fp.digest).read_text(), parse_constant=_refuse)
    assert document["families"]["cnn"]["candidates"][1]["timing"]["vs_baseline"]["high"] == "Infinity"


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def test_a_file_that_holds_bare_infinity_still_loads_and_is_written_strict(store: Store) -> None:
    """Files written before the strict form hold the bare constant: they load, and the next write is strict, their
    other families as read included."""
    from autotune._records import Interval

    fp = autotune.fingerprint()
    result = _result()
    bf16 = result.candidates[1]
    timing = bf16.timing.model_copy(update={"vs_baseline": Interval(estimate=0.5, low=0.0, high=float("inf"))})
    old = result.model_copy(update={"candidates": [result.candidates[0], bf16.model_copy(update={"timing": timing})]})
    store.save(fp, old)
    path = store.path(fp.digest)
    path.write_text(path.read_text().replace('"Infinity"', "Infinity"))  # as an older autotune wrote it
    fresh = Store(store.root)
    loaded = fresh.load(fp.digest)
    assert loaded is not None and loaded.families["cnn"] == old
    fresh.save(fp, _result("mlp"))
    document = json.loads(path.read_text(), parse_constant=_refuse)
    assert set(document["families"]) == {"cnn", "mlp"}


def test_store_file_never_unpickles(store: Store) -> None:
    import pickle

    fp = autotune.fingerprint()
    store.root.mkdir(parents=True)
    store.path(fp.digest).write_bytes(pickle.dumps({"schema_version": 1}))
    assert store.load(fp.digest) is None  # treated as corrupt, never executed


def test_clear_removes_results(store: Store) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result())
    removed = store.clear()
    assert store.path(fp.digest) in removed
    assert store.load(fp.digest) is None


def test_store_file_model_rejects_missing_fields() -> None:
    with pytest.raises(ValueError):
        StoreFile.model_validate({"schema_version": 1})


def test_unreadable_results_path_is_a_miss_with_a_warning(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    fp = autotune.fingerprint()
    store.path(fp.digest).mkdir(parents=True)  # something unreadable as a file where the results should be
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert store.load(fp.digest) is None
        saved = store.save(fp, result := _result())
    assert "cannot read" in caplog.text and "keeping results in memory" in caplog.text
    assert saved.families["cnn"] == result and store.load(fp.digest) == saved


def test_a_results_file_written_before_the_second_layout_step_loads_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fixtures/stores/written-at-293623d.json: a real calibration of tiny_mlp (precision search, 0.5 s budget)
    stored by the code before modules moved (the rules digest names modules, so its rules are older now)."""
    from autotune._answer import decided
    from autotune._cache.freshness import family_key, freshness, now_utc
    from autotune._cache.store import Store
    from autotune._families import get_family

    written = Path(__file__).parents[2] / "fixtures" / "stores" / "written-at-293623d.json"
    digest = json.loads(written.read_text())["fingerprint"]["digest"]
    (tmp_path / f"{digest}.json").write_bytes(written.read_bytes())
    stored = Store(tmp_path).load(digest)
    assert stored is not None and list(stored.families) == ["tiny_mlp"]
    measured = stored.families["tiny_mlp"]
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.5")
    verdict = freshness(measured, family_key(get_family("tiny_mlp")), now_utc())
    assert verdict.state == "older_rules" and verdict.answers and not verdict.final
    config = decided(measured, prefer="auto", expected_steps=None, forced_device=None, digest=digest)
    assert config.source == "measured" and config.device == "cpu" and "under older rules" in config.reason


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the store


def test_a_family_that_could_not_be_written_goes_with_the_next_write(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result("cnn"))
    _disk_full(monkeypatch)
    store.save(fp, _result("mlp"))
    monkeypatch.undo()
    store.save(fp, _result("transformer"))
    assert set(json.loads(store.path(fp.digest).read_text())["families"]) == {"cnn", "mlp", "transformer"}


def test_a_family_that_could_not_be_written_never_replaces_a_newer_measurement_of_it(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result("cnn"))
    _disk_full(monkeypatch)
    store.save(fp, _result("mlp"))
    monkeypatch.undo()
    newer = _result("mlp").model_copy(update={"measured_at": "2026-12-01T00:00:00+00:00", "wall_s": 2.0})
    theirs = tmp_path / "theirs.json"  # another process measured mlp afterwards and wrote it
    document = json.loads(store.path(fp.digest).read_text())
    document["families"]["mlp"] = json.loads(newer.model_dump_json())
    theirs.write_text(json.dumps(document))
    os.replace(theirs, store.path(fp.digest))
    loaded = store.load(fp.digest)
    assert loaded is not None and loaded.families["mlp"] == newer
    store.save(fp, _result("transformer"))
    stored = Store(store.root).load(fp.digest)
    assert stored is not None and set(stored.families) == {"cnn", "mlp", "transformer"}
    assert stored.families["mlp"] == newer


def test_what_a_process_could_not_write_and_its_warnings_are_once_per_file_whatever_the_store(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fp = autotune.fingerprint()
    store.save(fp, _result("cnn"))
    _disk_full(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        Store(store.root).save(fp, _result("mlp"))
        Store(store.root).save(fp, _result("transformer"))
    monkeypatch.undo()
    assert len([r for r in caplog.records if "No space left" in r.getMessage()]) == 1
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None and set(loaded.families) == {"cnn", "mlp", "transformer"}


def test_a_cache_directory_that_is_a_file_cannot_hold_the_lock_and_says_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    squatted = tmp_path / "cache"
    squatted.write_text("not a directory")
    fp = autotune.fingerprint()
    with caplog.at_level(logging.WARNING, logger="autotune"):
        saved = Store(squatted).save(fp, result := _result())
        Store(squatted).save(fp, result)
    locks = [r.getMessage() for r in caplog.records if "cannot use the lock" in r.getMessage()]
    assert len(locks) == 1 and "is a file, not a directory: move the file away" in locks[0]
    assert "keeping results in memory" in locks[0]
    assert saved.families["cnn"] == result and squatted.read_text() == "not a directory"
