"""The side files (demotions, loop summaries, max-batch and DataLoader answers) follow one set of rules: the
results files'. Each rule is checked on every kind, through the same calls their users make."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

from autotune._cache import batch_answers, demotions, loader_answers, loops
from autotune._cache.sidefiles import Change, Section, SideFile
from autotune._records import FP32_CPU
from autotune._reports import MaxBatchReport

KINDS = [demotions.FILES, loops.FILES, batch_answers.FILES, loader_answers.FILES]
IDS = [files.room for files in KINDS]


def _add(key: str, value: object) -> Change:
    def change(section: Section) -> Section:
        return {**section, key: value}

    return change


@pytest.mark.parametrize("files", KINDS, ids=IDS)
def test_a_file_from_a_newer_autotune_is_never_overwritten(files: SideFile, caplog: pytest.LogCaptureFixture) -> None:
    target = files.path("abc")
    target.parent.mkdir(parents=True, mode=0o700)
    newer = json.dumps({"schema_version": files.schema_version + 1, files.section: {"x": [1]}})
    target.write_text(newer)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert files.read("abc") == {}
        assert not files.update("abc", _add("y", [2]), "it holds for this process only")
    assert target.read_text() == newer
    assert "written by a newer autotune" in caplog.text
    assert files.read("abc") == {"y": [2]}  # held for this process


@pytest.mark.parametrize("files", KINDS, ids=IDS)
def test_a_file_that_is_no_such_document_is_moved_aside_when_read(
    files: SideFile, caplog: pytest.LogCaptureFixture
) -> None:
    target = files.path("abc")
    target.parent.mkdir(parents=True, mode=0o700)
    torn = f'{{"schema_version": {files.schema_version}, "{files.section}": {{"x": ['.encode()
    target.write_bytes(torn)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert files.read("abc") == {}
    assert not target.exists()
    [aside] = target.parent.glob(f"{target.name}.corrupt-*")
    assert aside.read_bytes() == torn
    assert f"{files.what} {target} was corrupt (not JSON" in caplog.text and files.lost in caplog.text


@pytest.mark.parametrize("files", KINDS, ids=IDS)
def test_keys_written_by_two_writers_are_both_kept_with_what_this_version_does_not_know(files: SideFile) -> None:
    target = files.path("abc")
    target.parent.mkdir(parents=True, mode=0o700)
    target.write_text(json.dumps({"schema_version": files.schema_version, "written_by": "a later minor version",
                                  files.section: {"theirs": {"unknown": True}}}))
    assert files.update("abc", _add("mine", [1]), "lost")
    document = json.loads(target.read_text())
    assert document["written_by"] == "a later minor version"
    assert document[files.section] == {"theirs": {"unknown": True}, "mine": [1]}


@pytest.mark.parametrize("files", KINDS, ids=IDS)
def test_a_change_that_cannot_be_written_holds_and_goes_with_the_next_write(
    files: SideFile, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    replace = os.replace

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the OS boundary, not the cache
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert not files.update("abc", _add("first", 1), "it holds for this process only")
    assert "No space left" in caplog.text
    assert files.read("abc") == {"first": 1}
    monkeypatch.setattr(os, "replace", replace)
    assert files.update("abc", _add("second", 2), "it holds for this process only")
    assert json.loads(files.path("abc").read_text())[files.section] == {"first": 1, "second": 2}
    files.reset()
    assert files.read("abc") == {"first": 1, "second": 2}  # the file speaks now


def _answer() -> MaxBatchReport:
    return MaxBatchReport(model_kind="batched", candidate=FP32_CPU, batch_size=8, peak_bytes=1, limit_bytes=2,
                          limit_from="memory_limit_mb", free_bytes=None, margin=0.15, target_bytes=1, line=None,
                          probes=[], measured_at="2026-01-01T00:00:00+00:00", wall_s=1.0)


def test_an_answer_this_version_cannot_read_costs_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    answer = _answer()
    answers = batch_answers.Answers("abc")
    answers.put("good", answer)
    assert batch_answers.FILES.update("abc", _add("broken", {"batch_size": "many"}), "lost")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert answers.get("broken") is None  # a miss: measured again
    assert "ignoring an unreadable answer" in caplog.text
    assert answers.get("good") == answer
    answers.put("new", answer)  # the unreadable one is written back as it was read
    assert json.loads(answers.path.read_text())["reports"]["broken"] == {"batch_size": "many"}


def test_a_question_with_control_characters_or_of_any_length_is_found_again() -> None:
    # A read of the file gives back printable text only; a question (a DataLoader's key=) may be anything.
    question = "version 2\nof the photos\x1b[2J" + "x" * 2_000
    batch_answers.Answers("abc").put(question, _answer())
    assert batch_answers.Answers("abc").get(question) == _answer()
