"""The canary (--check): cached picks re-timed in the worker; a pick that lost or fails is recalibrated."""

from __future__ import annotations

from pathlib import Path

import pytest
from samples import family, timed

import autotune
from autotune import _answer
from autotune._cache import lookup as _cached
from autotune._cli import main
from autotune._lab.check import faster_by_margin
from autotune._lab.protocol import Retimed
from autotune._records import Candidate, CandidateResult, Drop, Failure, Interval
from autotune._tools.check import _against, _judge

PICK = Candidate(device="cpu", precision="bf16-mixed")
FP32 = Candidate(device="cpu", precision="fp32")


def test_judge_keeps_a_pick_within_the_margin_and_flags_one_clearly_beaten() -> None:
    same = [Retimed(candidate=PICK, round_ms=[1.0, 1.01, 0.99, 1.0]),
            Retimed(candidate=FP32, round_ms=[1.01, 1.0, 1.0, 0.99])]
    assert _judge(PICK, [FP32], same, [], None)[0] == "ok"
    beaten = [Retimed(candidate=PICK, round_ms=[2.0, 2.02, 1.98, 2.0]),
              Retimed(candidate=FP32, round_ms=[1.01, 1.0, 1.0, 0.99])]
    verdict, detail = _judge(PICK, [FP32], beaten, [], None)
    assert verdict == "recalibrated" and "cpu fp32 is now faster than the pick" in detail
    crashed = [CandidateResult(candidate=PICK, failure=Failure(kind="crashed", detail="SIGABRT"))]
    assert _judge(PICK, [FP32], None, crashed, None) == ("recalibrated", "the pick failed: crashed: SIGABRT")


def test_only_a_gain_beyond_the_margin_is_worth_a_calibration() -> None:
    pick = [1.0, 1.001, 0.999, 1.0, 1.0]
    assert faster_by_margin([0.99, 0.991, 0.989, 0.99, 0.99], pick) is False  # a variant 1% faster: keep the pick
    assert faster_by_margin([0.9, 0.901, 0.899, 0.9, 0.9], pick) is True
    assert faster_by_margin([0.9, 1.1, 0.95, 1.05, 1.0], pick) is None  # the rounds cannot tell yet


@pytest.mark.usefixtures("in_process")
def test_check_on_a_healthy_cache_retimes_without_calibrating(tiny_family: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    before = autotune.calibrate([tiny_family]).measurements[tiny_family]
    code = main(["--check", "--family", tiny_family])
    out = capsys.readouterr().out
    after = _answer.cached_families([tiny_family])[tiny_family]
    # A loaded 2-core runner can make a pick lose for real: then it must have been measured again.
    assert (code, after.measured_at == before.measured_at) in ((0, True), (3, False))
    assert f"{tiny_family}: {'ok' if code == 0 else 'recalibrated'}: " in out


def test_a_pick_that_now_crashes_is_recalibrated_and_exit_3(isolated_autotune: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    autotune.register_family("abort_bf16", "families_for_tests:build_abort_under_bf16")
    # Recorded when bf16 still worked (say, before a driver update that kept the fingerprint).
    stale = family("abort_bf16", timed("cpu", "fp32", 2.0), timed("cpu", "bf16-mixed", 1.0))
    _cached.store().save(autotune.fingerprint(), stale)
    assert main(["--check", "--family", "abort_bf16"]) == 3
    out = capsys.readouterr().out
    assert "the pick failed: crashed" in out and "the pick is now cpu" in out
    now = _answer.cached_families(["abort_bf16"])["abort_bf16"]
    assert now.measured_at != stale.measured_at
    assert autotune.best_config("abort_bf16", wait=False).precision != "bf16-mixed"


def test_the_runner_up_is_another_device_precision_or_thread_count() -> None:
    def variant(result: CandidateResult, **settings: object) -> CandidateResult:
        return result.model_copy(update={"candidate": result.candidate.model_copy(update=settings)})

    pick = Candidate(device="cpu", precision="bf16-mixed", optimizer="fused")
    measured = family("f", timed("cpu", "fp32", 3.0), timed("cpu", "bf16-mixed", 1.01),
                      variant(timed("cpu", "bf16-mixed", 1.0), optimizer="fused"),
                      variant(timed("cpu", "bf16-mixed", 1.1), optimizer="fused", num_threads=1))
    # not plain bf16 (the pick's own math with another optimizer kernel), though it is faster than 1 thread
    assert _against(measured, pick) == [FP32, pick.model_copy(update={"num_threads": 1})]


def test_a_pick_of_fewer_threads_is_checked_against_torchs_own_count_it_dropped() -> None:
    pick = Candidate(device="cpu", precision="fp32", optimizer="fused", num_threads=1)
    one_thread = timed("cpu", "fp32", 0.95).model_copy(update={"candidate": pick})
    default = timed("cpu", "fp32", 1.0)
    assert default.timing is not None
    dropped = default.model_copy(update={"candidate": pick.model_copy(update={"num_threads": None}), "timing":
                                         default.timing.model_copy(update={"dropped": Drop(
                                             by=pick, ratio=Interval(estimate=1.05, low=1.01, high=1.09),
                                             rounds=122)})})
    measured = family("f", timed("cpu", "fp32", 1.5), one_thread, dropped)
    assert _against(measured, pick) == [FP32, dropped.candidate]


def test_a_pick_that_fails_its_set_up_is_reported_without_timing_the_others(isolated_autotune: Path) -> None:
    import time

    from autotune._apply import fp32 as _fp32
    from autotune._lab.check import check
    from autotune._lab.child import Control
    from autotune._lab.measure import Unwatched
    from autotune._lab.protocol import Begin, CalibrationSettings, Checked, CheckJob, Failed

    gone = Candidate(device="cuda:99", precision="bf16-mixed")  # a device this machine does not have
    job = CheckJob(family=autotune.Family("tiny", "families_for_tests:build_tiny"), candidates=[FP32, gone],
                   pick=gone, settings=CalibrationSettings(verify=False), fp32=_fp32.current(), threads=1,
                   sys_path=[])
    events: list[object] = []
    check(job, events.append, clock=time.perf_counter, control=Control(), settle=time.sleep, watch=Unwatched())
    failed = [e.result.candidate for e in events if isinstance(e, Failed)]
    assert failed == [gone]
    assert not any(isinstance(e, Begin) and e.phase == "timing" for e in events)
    assert [e for e in events if isinstance(e, Checked)] == [Checked(series=[], noisy=False)]
