"""What the command line prints for people: the decisions table and ``--explain``, readable at 80 and 100 columns.

The record is hand-made after a real cnn calibration (variants, stages, a drop chain, a failure with a long detail,
a demotion): how the output reads is the subject, not which candidate wins.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from families_for_tests import build_tiny
from samples import failed, family, timed

import autotune
from autotune._args import EPILOG
from autotune._cache import demotions, loops
from autotune._cache import lookup as _cached
from autotune._cli import main
from autotune._explain import EVIDENCE_LEGEND, MEASURED_LEGEND
from autotune._guard.watch import model_signature
from autotune._records import Candidate, CandidateResult, Demotion, Drop, FamilyResult, Interval
from autotune._reports import LoopSummary

KIND = "tiny"


def _variant(result: CandidateResult, **settings: object) -> CandidateResult:
    return result.model_copy(update={"candidate": result.candidate.model_copy(update=settings)})


def _staged(result: CandidateResult, stage: int, *, dropped_by: Candidate | None = None,
            ratio: float = 1.5) -> CandidateResult:
    assert result.timing is not None
    drop = Drop(by=dropped_by, ratio=Interval(estimate=ratio, low=ratio * 0.7, high=ratio * 1.6), rounds=4) \
        if dropped_by is not None else None
    return result.model_copy(update={"timing": result.timing.model_copy(update={
        "stage": stage, "final": drop is None, "dropped": drop})})


def _record() -> FamilyResult:
    """After the README's cnn: fp32 and plain bf16 dropped in stages, bf16 with channels_last and the fused
    optimizer against bf16 with channels_last in the final rounds, fp16 too slow."""
    last = Candidate(device="cpu", precision="bf16-mixed", memory_format="channels_last")
    pick = _variant(timed("cpu", "bf16-mixed", 46.0, rounds=30), memory_format="channels_last", optimizer="fused")
    return family(KIND, *[
        _staged(timed("cpu", "fp32", 141.0, rounds=4), 1, dropped_by=Candidate(device="cpu", precision="bf16-mixed"),
                ratio=2.1),
        _staged(timed("cpu", "bf16-mixed", 69.0, rounds=5), 2, dropped_by=last),
        failed("cpu", "fp16-mixed", "too_slow", "a forward and backward pass on 4 of 32 samples took over 183 ms "
               "twice, 8x cpu fp32's (21.9 ms; the limit: 175 ms, 8x it and 809 ms for the full step); stopped "
               "before a full step"),
        _staged(_variant(timed("cpu", "bf16-mixed", 49.0, rounds=30), memory_format="channels_last"), 4),
        _staged(_variant(timed("cpu", "bf16-mixed", 66.0, rounds=4), optimizer="fused"), 2, dropped_by=last),
        _staged(pick, 4),
        _staged(_variant(timed("cpu", "bf16-mixed", 82.0, rounds=5), memory_format="channels_last",
                         num_threads=1), 3, dropped_by=last, ratio=1.7),
    ], notes={"cuda": "this torch build has no CUDA support", "mps": "Apple Metal exists only on macOS"}).model_copy(
        update={"search_notes": ["stage 2: cpu bf16-mixed channels_last, cpu bf16-mixed fused-optimizer against "
                                 "cpu bf16-mixed"]})


def _render(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int,
            *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))  # the output is piped: COLUMNS says how wide
    assert main(list(args)) == 0
    return capsys.readouterr().out


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\s─━│┃]+", text))


@pytest.fixture
def measured(tiny_family: str) -> None:
    _cached.store().save(autotune.fingerprint(), _record())
    demotions.record(autotune.fingerprint().digest, Demotion(
        model_kind=KIND, candidate=Candidate(device="cpu", precision="fp16-mixed"), seen="non_finite", step=5_120,
        detail="3 non-finite losses within 100 steps (steps 5,120, 5,121, 5,122; the last finite one 0.3127)",
        evidence=[0.3127, math.nan, math.nan, math.nan], at="2026-12-03T10:04:00+00:00", autotune_version="0",
        model=model_signature(build_tiny().model), family_model=True))
    loops.record(autotune.fingerprint().digest, LoopSummary(  # a training run's loop, as guard.data saw it
        model_kind=KIND, candidate=Candidate(device="cpu", precision="bf16-mixed", memory_format="channels_last"),
        steps=1_200, batches=1_200, data_wait_share=0.62, data_ms=75.1, step_ms=46.3, measured_step_ms=46.0,
        started_at="2026-12-03T09:00:00.000000+00:00", at="2026-12-03T10:00:00+00:00", autotune_version="0"))


@pytest.mark.usefixtures("measured")
@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("command", [["--explain", KIND], ["--family", KIND]], ids=["explain", "table"])
def test_the_output_fits_the_width_without_splitting_a_word(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int, command: list[str]
) -> None:
    wide = _render(capsys, monkeypatch, 1000, *command)
    narrow = _render(capsys, monkeypatch, columns, *command)
    too_long = [line for line in narrow.splitlines() if len(line.rstrip()) > columns]
    assert too_long == []
    assert _words(narrow) <= _words(wide), sorted(_words(narrow) - _words(wide))  # a split word is a new one
    assert "channels_last" in narrow and "fused-optimizer" in narrow
    # what the loop end to end adds: the decisions table's caption, --explain's line on the training run
    said = "per training step" if command[0] == "--family" else "62% waiting for data; per training step"
    assert said in " ".join(narrow.split())


@pytest.mark.usefixtures("measured")
def test_explain_shows_each_candidate_against_fp32_on_the_cpu_and_explains_every_column(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _render(capsys, monkeypatch, 200, "--explain", KIND)
    header = next(line for line in out.splitlines() if "vs fp32 CPU" in line)
    start = header.index("vs fp32 CPU")
    below = [line[start:start + 11].strip() for line in out.splitlines()[out.splitlines().index(header) + 2:]][:7]
    assert below.count("-") == 2  # fp32 itself and the failure; the others from the decision's paired evidence
    # The pick: fp32 was dropped at 2.1x bf16, bf16 at 1.5x bf16 channels_last, which is 1.1x the pick: 0.3x.
    assert re.search(r"final +46 ms +30 x 1 +0\.3x ", out)
    assert "cpu fp16-mixed demoted on 2026-12-03 after NaN losses from step 5,120" in " ".join(out.split())
    for legend in (MEASURED_LEGEND, EVIDENCE_LEGEND):
        assert " ".join(out.split()).count(legend.split(":")[0] + ":") >= 1
    assert "rounds: R x S, R interleaved rounds of S steps each" in " ".join(out.split())
    for column in ("timed in", "step", "rounds", "vs fp32 CPU", "set-up", "peak MiB", "numerics", "verdict",
                   "time ratio", "interval"):
        assert f"{column}:" in MEASURED_LEGEND + EVIDENCE_LEGEND, column
    for column in ("also", "step", "vs fp32 CPU", "peak MiB", "source"):
        assert f"{column}:" in " ".join(EPILOG.split()), column


@pytest.mark.usefixtures("measured")
def test_a_column_that_carries_nothing_is_left_out(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = _render(capsys, monkeypatch, 200, "--family", KIND)
    assert "peak MiB" not in out  # nothing measured a peak
    assert "vs fp32 CPU" in out and "also" in out


@pytest.mark.usefixtures("measured")
def test_json_output_is_strict_and_carries_the_demotions(capsys: pytest.CaptureFixture[str]) -> None:
    """The demotion's NaN losses are strings in --json, as in the files: every JSON parser reads it."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    assert main(["--family", KIND, "--json"]) == 0
    document = json.loads(capsys.readouterr().out, parse_constant=refuse)
    [demotion] = document["configs"][KIND]["evidence"]["demotions"]
    assert demotion["evidence"] == [0.3127, "NaN", "NaN", "NaN"] and demotion["step"] == 5_120
    assert autotune.Config.model_validate(document["configs"][KIND]).evidence.demotions[0].step == 5_120  # type: ignore[union-attr]


def test_without_columns_a_pipe_gets_120(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, tiny_family: str) -> None:
    _cached.store().save(autotune.fingerprint(), _record())
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["--explain", KIND]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) == 120
