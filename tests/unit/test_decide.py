from __future__ import annotations

import logging

import pytest
from samples import failed, family, rival, timed

from autotune import CalibrationError, _stats
from autotune._config import config_of
from autotune._decide import decide, picked
from autotune._records import Candidate, CandidateResult, Drop, Interval

DIGEST = "0123456789abcdef"


def test_clear_winner_is_picked_with_its_numbers_in_the_reason_and_the_evidence() -> None:
    measured = family("cnn", timed("cpu", "fp32", 110.0), timed("cpu", "bf16-mixed", 58.6))
    config = decide(measured, digest=DIGEST)
    assert (config.device, config.precision, config.source) == ("cpu", "bf16-mixed", "measured")
    assert config.reason == "bf16 mixed precision on the CPU: 1.9x faster per step than fp32 (measured 2026-11-30)"
    fp32 = rival(config, "cpu fp32")
    assert (fp32.role, fp32.verdict, fp32.against, fp32.rounds) == ("precision", "slower", config.candidate, 6)
    assert fp32.ratio is not None and fp32.ratio.estimate == pytest.approx(110 / 58.6, rel=0.02)
    assert 1 < fp32.ratio.low < fp32.ratio.estimate < fp32.ratio.high
    assert fp32.step_ms == pytest.approx(110, rel=0.02) and fp32.margin == 0.03
    assert config.speedup_vs_fp32_cpu == pytest.approx(110 / 58.6, rel=0.02)


def test_a_difference_within_noise_is_a_tie_and_fp32_wins() -> None:
    measured = family("mlp", timed("cpu", "fp32", 10.0, jitter=4), timed("cpu", "bf16-mixed", 9.9, jitter=4))
    config = decide(measured, digest=DIGEST)
    assert config.precision == "fp32"
    assert config.reason == "fp32 on the CPU: bf16 mixed precision was no faster (measured 2026-11-30)"
    bf16 = rival(config, "cpu bf16-mixed")
    assert (bf16.verdict, bf16.margin, bf16.rounds) == ("tie", 0.03, 6)


def test_a_gap_at_the_margin_is_won_only_on_evidence_and_a_tie_is_resolved_or_named_open() -> None:
    # bf16 3.1% faster: inside the zone where either answer is right. Six rounds cannot show bf16 more than 3%
    # faster, nor fp32 within 4% of it: the tie goes to fp32 and the evidence names the pair still open.
    measured = family("mlp", timed("cpu", "fp32", 10.0), timed("cpu", "bf16-mixed", 9.7))
    config = decide(measured, digest=DIGEST)
    assert config.evidence is not None
    if config.precision == "bf16-mixed":
        fp32 = rival(config, "cpu fp32")
        assert fp32.verdict == "slower" and fp32.ratio is not None and fp32.ratio.low > 1.03
    else:
        bf16 = rival(config, "cpu bf16-mixed")
        assert bf16.verdict == "tie" and bf16.ratio is not None
        assert bf16.ratio.low * 1.04 > 1 or bf16.candidate in config.evidence.unresolved


def test_explain_names_a_pair_still_open() -> None:
    from autotune._wording import qualifiers

    config = decide(family("mlp", timed("cpu", "fp32", 10.0), timed("cpu", "bf16-mixed", 9.7)), digest=DIGEST)
    assert config.evidence is not None
    assert any(line.startswith("still open when timing stopped") and line.endswith(": cpu bf16-mixed")
               for line in qualifiers(config.evidence, init_scale=config.init_scale))


def test_a_tie_the_rounds_resolve_names_nothing_open() -> None:
    # bf16 1% slower, the rounds tight: fp32 is surely within 4% of it, nothing is left open.
    measured = family("mlp", timed("cpu", "fp32", 10.0, jitter=0.2), timed("cpu", "bf16-mixed", 10.1, jitter=0.2))
    config = decide(measured, digest=DIGEST)
    assert config.precision == "fp32" and config.evidence is not None and config.evidence.unresolved == []


def test_a_clear_10_percent_gap_is_a_win() -> None:
    measured = family("mlp", timed("cpu", "fp32", 10.0), timed("cpu", "bf16-mixed", 9.0))
    assert decide(measured, digest=DIGEST).precision == "bf16-mixed"


def test_failed_candidate_is_never_picked_and_is_named() -> None:
    measured = family(
        "cnn",
        timed("cpu", "fp32", 100.0),
        failed("cpu", "bf16-mixed", "crashed", "SIGABRT"),
    )
    config = decide(measured, digest=DIGEST)
    assert config.precision == "fp32"
    assert config.reason == "fp32 on the CPU: bf16 mixed precision crashed (measured 2026-11-30)"
    bf16 = rival(config, "cpu bf16-mixed")
    assert bf16.verdict == "failed" and bf16.failure is not None
    assert (bf16.failure.kind, bf16.failure.detail) == ("crashed", "SIGABRT")


def test_all_failed_raises_with_each_failure() -> None:
    measured = family("x", failed("cpu", "fp32", "oom", "MemoryError"), failed("cpu", "bf16-mixed", "timeout", "hung"))
    with pytest.raises(CalibrationError) as info:
        decide(measured, digest=DIGEST)
    assert info.value.failures == [("cpu fp32", "oom: MemoryError"), ("cpu bf16-mixed", "timeout: hung")]


def test_prefer_gpu_without_a_gpu_answers_cpu_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    measured = family("tiny_mlp", timed("cpu", "fp32", 1.0),
                      notes={"cuda": "this torch build has no CUDA support; NVIDIA driver found"})
    with caplog.at_level(logging.WARNING, logger="autotune"):
        config = decide(measured, prefer="gpu", digest=DIGEST)
    assert config.device == "cpu"
    assert config.reason.startswith("fp32 on the CPU: GPU requested, but there is no usable GPU")
    assert config.evidence is not None and config.evidence.prefer == "gpu"
    assert config.evidence.no_gpu == "there is no usable GPU (cuda: this torch build has no CUDA support; NVIDIA " \
                                     "driver found)"
    assert "GPU requested" in caplog.text


def test_a_dropped_candidate_never_wins_a_tie_and_its_evidence_is_the_reason() -> None:
    fp32 = timed("cpu", "fp32", 51.0, rounds=1)
    drop = Drop(by=Candidate(device="cpu", precision="bf16-mixed"),
                ratio=Interval(estimate=8.6, low=8.6, high=8.6), rounds=1, far_behind=True)
    assert fp32.timing is not None
    fp32 = fp32.model_copy(update={"timing": fp32.timing.model_copy(update={"dropped": drop, "final": False})})
    config = decide(family("gap", fp32, timed("cpu", "bf16-mixed", 5.9)), digest=DIGEST)
    assert config.precision == "bf16-mixed"
    assert config.reason == "bf16 mixed precision on the CPU: 8.6x faster per step than fp32 (measured 2026-11-30)"
    evidence = rival(config, "cpu fp32")
    assert (evidence.verdict, evidence.against, evidence.rounds, evidence.far_behind) == (
        "dropped", drop.by, 1, True)
    assert evidence.ratio == drop.ratio


@pytest.mark.parametrize(("low", "high", "words", "speedup"), [
    (3.6, 4.0, "3.8x faster per step than fp32", 3.8),
    (1.08, 4.9, "at least 1.1x faster per step than fp32", 1.08),
], ids=["known-to-10pct", "a-bound-from-a-wide-interval"])
def test_the_headline_ratio_is_the_estimate_only_where_its_interval_knows_it(
        low: float, high: float, words: str, speedup: float) -> None:
    # fp32 dropped after 4 noisy rounds: "3.8x faster" stated from an interval of 1.08-4.9 would be a guess.
    fp32 = timed("cpu", "fp32", 100.0, rounds=4)
    drop = Drop(by=Candidate(device="cpu", precision="bf16-mixed"), ratio=Interval(estimate=3.8, low=low, high=high),
                rounds=4)
    assert fp32.timing is not None
    fp32 = fp32.model_copy(update={"timing": fp32.timing.model_copy(update={"dropped": drop, "final": False})})
    config = decide(family("cnn", fp32, timed("cpu", "bf16-mixed", 26.0)), digest=DIGEST)
    assert config.reason == f"bf16 mixed precision on the CPU: {words} (measured 2026-11-30)"
    assert config.speedup_vs_fp32_cpu == pytest.approx(speedup)


def test_the_speedup_never_contradicts_the_evidence_where_the_chain_of_drops_breaks() -> None:
    # fp32 was dropped by a setting that is not in the record, on its slow rounds; its mean over them reads faster
    # than the pick's, timed at another moment: the evidence says fp32 is slower, so no figure says otherwise.
    fp32 = timed("cpu", "fp32", 20.0, rounds=4)
    gone = Candidate(device="cpu", precision="bf16-mixed", memory_format="channels_last")
    assert fp32.timing is not None
    drop = Drop(by=gone, ratio=Interval(estimate=1.5, low=1.2, high=1.9), rounds=4)
    fp32 = fp32.model_copy(update={"timing": fp32.timing.model_copy(update={"dropped": drop, "final": False})})
    config = decide(family("cnn", fp32, timed("cpu", "bf16-mixed", 26.0)), digest=DIGEST)
    assert config.candidate == Candidate(device="cpu", precision="bf16-mixed")
    assert "fp32 was clearly slower" in config.reason
    assert config.speedup_vs_fp32_cpu is None


def test_forced_device_is_marked_forced() -> None:
    measured = family("cnn", timed("cpu", "fp32", 100.0), timed("cpu", "bf16-mixed", 50.0))
    config = decide(measured, forced_device="cpu", digest=DIGEST)
    assert (config.device, config.precision, config.source) == ("cpu", "bf16-mixed", "forced")
    assert config.reason.startswith("bf16 mixed precision on the CPU: forced by AUTOTUNE_DEVICE=cpu; 2.0x faster")
    assert config.evidence is not None and config.evidence.forced == "cpu"


def test_forced_device_that_was_not_measured_uses_fp32_and_says_so() -> None:
    measured = family("cnn", timed("cpu", "fp32", 100.0))
    config = decide(measured, forced_device="cuda:1", digest=DIGEST)
    assert (config.device, config.precision, config.source) == ("cuda:1", "fp32", "forced")
    assert config.reason == ("fp32 on cuda:1: forced by AUTOTUNE_DEVICE=cuda:1; calibration did not measure cuda:1 "
                             "here (measured: cpu)")
    assert config.evidence is not None and config.evidence.forced == "cuda:1" and not config.evidence.rivals


def test_noisy_measurement_is_flagged_on_the_config_and_in_the_reason() -> None:
    config = decide(family("cnn", timed("cpu", "fp32", 100.0), noisy=True), digest=DIGEST)
    assert config.noisy and config.evidence is not None and config.evidence.noisy
    assert config.reason == ("fp32 on the CPU: the only candidate measured (measured 2026-11-30 on a busy machine; "
                             "the next calibration measures it again)")


def test_fp16_pick_reports_the_lowered_init_scale() -> None:
    fp16 = timed("cpu", "fp16-mixed", 10.0, init_scale=1024.0)
    numerics = fp16.numerics.model_copy(update={"default_scale_skipped": 3, "losses": [1.0] * 8})
    measured = family("det", timed("cpu", "fp32", 30.0), fp16.model_copy(update={"numerics": numerics}))
    config = decide(measured, digest=DIGEST)
    assert (config.precision, config.init_scale) == ("fp16-mixed", 1024.0)
    assert config.evidence is not None
    assert (config.evidence.default_scale_skipped, config.evidence.verified_steps) == (3, 8)
    assert config_of(config).grad_scaler().get_scale() == 1024.0


def test_the_same_math_is_ranked_on_the_final_rounds_both_were_timed_in() -> None:
    # channels_last, 3.5% slower, settled after 11 final rounds; the plain layout went on (against another
    # pair) into 30 rounds of a machine 8% slower. Its median over all 41 rounds (10.8 ms) is not compared
    # with channels_last's over the first 11 (10.35 ms): over the rounds both share, plain is faster.
    def rounds(result: CandidateResult, round_ms: list[float], **candidate: str) -> CandidateResult:
        assert result.timing is not None
        return result.model_copy(update={
            "candidate": result.candidate.model_copy(update=candidate),
            "timing": result.timing.model_copy(update={"round_ms": round_ms,
                                                       "median_ms": sorted(round_ms)[len(round_ms) // 2]})})

    swing = [1.15, 0.85] * 5 + [1.0]  # too noisy, round to round, for either to be clearly faster
    plain = rounds(timed("cpu", "fp32", 10.0), [10.0 * f for f in swing] + [10.8] * 30)
    channels_last = rounds(timed("cpu", "fp32", 10.35), [10.35 * f for f in reversed(swing)],
                           memory_format="channels_last")
    config = decide(family("cnn", plain, channels_last), digest=DIGEST)
    assert config.memory_format == "contiguous"


def test_each_variant_of_a_pick_has_its_own_evidence() -> None:
    # fused AdamW and 1 thread: the evidence says why each, not only why both beat plain fp32 (the thread count
    # won by dropping torch's own)
    def variant(result: CandidateResult, **settings: object) -> CandidateResult:
        return result.model_copy(update={"candidate": result.candidate.model_copy(update=settings)})

    pick = variant(timed("cpu", "fp32", 0.7), optimizer="fused", num_threads=1)
    fused = variant(timed("cpu", "fp32", 0.75), optimizer="fused")
    assert fused.timing is not None
    fused = fused.model_copy(update={"timing": fused.timing.model_copy(update={"dropped": Drop(
        by=pick.candidate, ratio=Interval(estimate=1.07, low=1.02, high=1.12), rounds=150)})})
    config = decide(family("tiny", timed("cpu", "fp32", 1.0), fused, pick), digest=DIGEST)
    assert config.num_threads == 1
    without_thread = rival(config, "cpu fp32 fused-optimizer")
    assert (without_thread.role, without_thread.verdict, without_thread.against, without_thread.rounds) == (
        "variant", "dropped", pick.candidate, 150)
    assert without_thread.ratio == Interval(estimate=1.07, low=1.02, high=1.12)
    plain = rival(config, "cpu fp32")
    assert (plain.role, plain.verdict, plain.rounds) == ("variant", "slower", 6)
    assert config.reason == ("fp32 with the fused optimizer and 1 thread on the CPU: 1.4x faster per step than "
                             "plain fp32 (measured 2026-11-30)")


@pytest.mark.parametrize("results", [
    (timed("cpu", "fp32", 110.0), timed("cpu", "bf16-mixed", 58.6)),
    (timed("cpu", "fp32", 10.0, jitter=4), timed("cpu", "bf16-mixed", 9.9, jitter=4)),
    (timed("cpu", "fp32", 100.0), timed("cuda:0", "bf16-mixed", 20.0), timed("cuda:0", "fp32", 40.0)),
], ids=["bf16-wins", "tie", "gpu-wins"])
def test_picked_is_the_decisions_candidate_without_its_reason_or_log(results: tuple[CandidateResult, ...],
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    measured = family("cnn", *results)
    with caplog.at_level(logging.DEBUG, logger="autotune"):
        candidate = picked(measured)
    assert not caplog.records
    assert candidate == decide(measured, digest=DIGEST).candidate


def test_picked_raises_like_decide_when_nothing_trains() -> None:
    measured = family("cnn", failed("cpu", "fp32", "error", "boom"))
    with pytest.raises(CalibrationError, match="boom"):
        picked(measured)


def test_the_info_log_line_is_the_reason_and_debug_carries_the_evidence(caplog: pytest.LogCaptureFixture) -> None:
    measured = family("cnn", timed("cpu", "fp32", 110.0), timed("cpu", "bf16-mixed", 58.6))
    with caplog.at_level(logging.DEBUG, logger="autotune"):
        config = decide(measured, digest=DIGEST)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert info == [f"cnn: {config.reason}"]
    assert config.evidence is not None
    assert debug == [f"cnn: the evidence: {config.evidence.model_dump_json()}"]


def test_the_decisions_alpha_is_split_over_the_final_comparison_as_it_began() -> None:
    # Four timed in the final comparison, two dropped there: bf16 beats fp32 by the margin at one look's share
    # over 1 pair, not over the 3 each finalist had when the comparison began. Split over the two left, the
    # same pair would be tested again at three times the alpha its looks spent.
    fp32 = timed("cpu", "fp32", 10.0, rounds=12, jitter=3)
    wiggle = [1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.01, 0.99]
    base = [x * w for x, w in zip(fp32.timing.round_ms, wiggle, strict=True)]  # type: ignore[union-attr]
    wide, narrow = (_stats.ratio_interval(base, fp32.timing.round_ms,  # type: ignore[union-attr]
                                          alpha=_stats.ALPHA_PER_LOOK / k)[2] for k in (3, 1))
    scale = 1 / 1.03 / (wide * narrow) ** 0.5  # clearly faster at the larger alpha only
    bf16 = timed("cpu", "bf16-mixed", 10.0, rounds=12)
    bf16 = bf16.model_copy(update={"timing": bf16.timing.model_copy(  # type: ignore[union-attr]
        update={"round_ms": [x * scale for x in base]})})
    drop = Drop(by=bf16.candidate, ratio=Interval(estimate=2.0, low=1.8, high=2.2), rounds=12, far_behind=False)
    dropped = [timed("cpu", p, 20.0, rounds=12) for p in ("fp16-mixed", "tf32")]
    dropped = [r.model_copy(update={"timing": r.timing.model_copy(update={"dropped": drop})})  # type: ignore[union-attr]
               for r in dropped]
    measured = family("mlp", fp32, bf16, *dropped)
    assert decide(family("mlp", fp32, bf16), digest=DIGEST).precision == "bf16-mixed"
    assert decide(measured, digest=DIGEST).precision == "fp32"
