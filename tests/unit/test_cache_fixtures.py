"""The cache files as 3900c59 wrote them (fixtures/stores/*-at-3900c59*): a real calibration of tiny_mlp (precision
search, 0.5 s budget) with one demotion, one loop summary and one max-batch answer beside it. They load and answer
through today's code, and today's writes give the same bytes (the cache format holds)."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest

from autotune._cache import batch_answers, demotions, loops
from autotune._cache.store import Store
from autotune._records import FP32_CPU, Candidate, Demotion

FIXTURES = Path(__file__).parents[2] / "fixtures" / "stores"
WRITTEN = FIXTURES / "written-at-3900c59.json"
SIDE_FILES = FIXTURES / "sidefiles-at-3900c59"
DIGEST = json.loads(WRITTEN.read_text())["fingerprint"]["digest"]
QUESTION = "tiny_mlp|cpu fp32|memory_limit_mb=64|0.15"


@pytest.fixture
def written(isolated_autotune: Path) -> Path:
    """The cache directory holding the fixture's results file and side files."""
    isolated_autotune.mkdir()
    shutil.copyfile(WRITTEN, isolated_autotune / f"{DIGEST}.json")
    shutil.copytree(SIDE_FILES, isolated_autotune, dirs_exist_ok=True)
    return isolated_autotune


def test_the_results_file_loads_without_a_warning_and_answers_measured(
    written: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autotune._answer import decided

    with caplog.at_level(logging.WARNING, logger="autotune"):
        stored = Store(written).load(DIGEST)
    assert caplog.text == ""
    assert stored is not None and list(stored.families) == ["tiny_mlp"] and stored.fingerprint.digest == DIGEST
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.5")
    config = decided(stored.families["tiny_mlp"], prefer="auto", expected_steps=None, forced_device=None,
                     digest=DIGEST)
    assert config.source == "measured" and config.device == "cpu"


def test_each_side_file_reads_back_through_its_module(written: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autotune"):
        [demotion] = demotions.of(DIGEST, "tiny_mlp")
        [loop] = loops.of(DIGEST, "tiny_mlp")
        answer = batch_answers.Answers(DIGEST).get(QUESTION)
    assert caplog.text == ""
    assert demotion.candidate == Candidate(device="cpu", precision="bf16-mixed") and demotion.step == 5_120
    assert demotion.evidence[0] == 0.3127 and math.isnan(demotion.evidence[1]) and demotion.evidence[2] == math.inf
    assert (loop.candidate, loop.steps, loop.started_at) == (FP32_CPU, 1_200, "2026-12-06T11:00:00.000000+00:00")
    assert answer is not None and (answer.batch_size, answer.limit_bytes) == (512, 67_108_864)


def test_a_save_into_an_empty_store_writes_the_bytes_3900c59_wrote(written: Path, tmp_path: Path) -> None:
    stored = Store(written).load(DIGEST)
    assert stored is not None
    empty = Store(tmp_path / "empty")
    empty.save(stored.fingerprint, stored.families["tiny_mlp"])
    assert empty.path(DIGEST).read_bytes() == WRITTEN.read_bytes()


def test_a_side_file_update_writes_the_bytes_3900c59_wrote(written: Path) -> None:
    """fixtures/stores/golden-demotions-at-3900c59.json: 3900c59 recorded this demotion over the fixture's file."""
    demotions.record(DIGEST, Demotion(
        model_kind="tiny_mlp", candidate=Candidate(device="cpu", precision="fp16-mixed"), seen="non_finite", step=7,
        detail="2 non-finite losses", evidence=[math.nan, 1.5], at="2026-12-06T12:00:00+00:00",
        autotune_version="0.1.0", family_model=True))
    golden = FIXTURES / "golden-demotions-at-3900c59.json"
    assert demotions.path(DIGEST).read_bytes() == golden.read_bytes()
