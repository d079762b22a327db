"""What the results directory keeps over time: files pruned by last use (a few kept for a hardware swap back),
quarantined files and a killed writer's temp files cleared, a corrupt file another process replaced judged again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from samples import measured, saved_store

import autotune
from autotune._cache.store import KEEP_FILES, KEEP_QUARANTINED, Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return saved_store(tmp_path / "store")


DAY_S = 86400.0


def _other_machines(store: Store, count: int) -> list[Path]:
    base = autotune.fingerprint().model_dump(exclude={"digest"})
    paths = []
    for cores in range(100, 100 + count):
        fp = autotune.Fingerprint.model_validate({**base, "usable_cores": cores})
        Store(store.root).save(fp, measured("cnn"))
        paths.append(store.path(fp.digest))
    return paths


def _age(path: Path, *, written_days: float, used_days: float | None) -> None:
    now = time.time()
    os.utime(path, (now - written_days * DAY_S, now - written_days * DAY_S))
    marker = path.with_suffix(".used")
    if used_days is None:
        marker.unlink(missing_ok=True)
    else:
        marker.write_text(f"{now - used_days * DAY_S:.0f}\n")


def test_pruning_keeps_files_used_within_30_days_whatever_their_modification_time(store: Store) -> None:
    others = _other_machines(store, KEEP_FILES + 4)
    for i, path in enumerate(others):
        # Written long ago by other environments; the first four were read (used) yesterday.
        _age(path, written_days=90 + i, used_days=1 if i < 4 else 40 + i)
    store.save(autotune.fingerprint(), measured("cnn"))  # a save prunes
    left = set(store.root.glob("*.json"))
    assert set(others[:4]) <= left, "files in use by another environment are never pruned"
    assert store.path(autotune.fingerprint().digest) in left
    assert len(left) == KEEP_FILES
    assert not any(p.with_suffix(".used").exists() for p in set(others) - left)


def test_pruning_keeps_a_few_unused_files_for_a_hardware_swap_back(store: Store) -> None:
    others = _other_machines(store, 3)
    for path in others:
        _age(path, written_days=400, used_days=None)  # no marker: an older autotune's file
    store.save(autotune.fingerprint(), measured("cnn"))
    assert set(others) <= set(store.root.glob("*.json"))


def test_loading_marks_a_file_used(store: Store) -> None:
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    _age(path, written_days=60, used_days=60)
    Store(store.root).load(fp.digest)
    assert time.time() - float(path.with_suffix(".used").read_text()) < 60


def test_quarantined_files_beyond_a_few_are_pruned(store: Store) -> None:
    fp = autotune.fingerprint()
    path = store.path(fp.digest)
    for _ in range(KEEP_QUARANTINED + 3):
        path.write_bytes(b"garbage")
        Store(store.root).load(fp.digest)  # quarantines it
    assert len(list(store.root.glob("*.corrupt-*"))) == KEEP_QUARANTINED + 3
    newest = sorted(p.name for p in store.root.glob("*.corrupt-*"))[-KEEP_QUARANTINED:]
    store.save(fp, measured("cnn"))
    assert sorted(p.name for p in store.root.glob("*.corrupt-*")) == newest


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_save(store: Store) -> None:
    fp = autotune.fingerprint()
    stale = store.root / f".{store.path(fp.digest).name}.abc123.tmp"
    stale.write_text('{"half a wri')
    Store(store.root).save(fp, measured("cnn"))
    assert not stale.exists()


def test_a_corrupt_file_replaced_by_another_process_meanwhile_is_judged_again_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = autotune.fingerprint()
    theirs = Store(tmp_path / "theirs")
    theirs.save(fp, measured("mlp"))  # what the other process is about to publish
    store = Store(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    path = store.path(fp.digest)
    path.write_bytes(b"garbage")
    real_lstat = os.lstat
    calls = 0

    def racing(file: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        nonlocal calls
        if Path(file) == path:
            calls += 1
            if calls == 2:  # between our read and our quarantine, the other process replaces the file
                os.replace(theirs.path(fp.digest), path)
        return real_lstat(file, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", racing)
    saved = store.save(fp, cnn := measured("cnn"))
    monkeypatch.undo()
    assert set(saved.families) == {"cnn", "mlp"} and saved.families["cnn"] == cnn
    loaded = Store(store.root).load(fp.digest)
    assert loaded is not None and set(loaded.families) == {"cnn", "mlp"}
    assert list(store.root.glob("*.corrupt-*")) == []
