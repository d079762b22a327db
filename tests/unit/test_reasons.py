"""Every reason is one sentence of at most 160 characters, the answer first, whatever qualifies it; the suite's
own reasons are checked by conftest's ``reasons`` fixture, these are the longest the wording can meet."""

from __future__ import annotations

import pytest
from reasons_for_tests import one_sentence_problem
from samples import family, timed

from autotune._decide import decide, restate
from autotune._records import CandidateResult, Difference, MachineLoad, NoiseCause, ProcessLoad, SimilarMachine
from autotune._wording import answer_words, noise_words, remeasure_advice, short_noise_words

DIGEST = "0123456789abcdef"
LONG_WHY = "another process is still calibrating after AUTOTUNE_LOCK_TIMEOUT_S=86400 s of waiting"


def _longest_pick() -> list[CandidateResult]:
    """A pick with every variant on an accelerator, against the CPU and plain fp32 on its device."""
    best = timed("xpu:0", "bf16-mixed", 10.0)
    best = best.model_copy(update={"candidate": best.candidate.model_copy(update={
        "memory_format": "channels_last", "optimizer": "foreach", "compiled": True})})
    return [timed("cpu", "fp32", 100.0), timed("xpu:0", "fp32", 30.0), best]


@pytest.mark.parametrize("flags", [
    {},
    {"noisy": True},
    {"noisy": True, "older_rules": "0.1.0"},
    {"noisy": True, "older_rules": "0.1.0", "origin": "imported from results-of-the-whole-lab-2026.json "
                                                      "(exported 2026-11-30)"},
    {"origin": "shipped in results.json"},
    {"unmeasured": LONG_WHY},
    {"unmeasured": LONG_WHY, "similar": SimilarMachine(measured_at="2026-11-30", differences=[
        Difference(name="torch", then="2.12.0", now="2.13.0"), Difference(name="python", then="3.11", now="3.12"),
        Difference(name="NVIDIA GeForce RTX 3090 driver", then="550.54", now="560.35")])},
], ids=["measured", "noisy", "noisy-older-rules", "noisy-older-rules-imported", "shipped", "heuristic",
        "similar-machine"])
@pytest.mark.parametrize("forced", [None, "xpu:0"], ids=["auto", "forced"])
def test_the_longest_reasons_are_one_sentence_that_starts_with_the_answer(flags: dict[str, object],
                                                                           forced: str | None) -> None:
    config = decide(family("cnn", *_longest_pick()), forced_device=forced, digest=DIGEST)
    config = restate(config, **flags)
    assert one_sentence_problem(config.reason) is None, config.reason
    assert config.reason.startswith(answer_words(config.candidate))
    assert ("busy machine" in config.reason) == bool(flags.get("noisy"))
    if forced is not None:
        assert "forced" in config.reason
    elif "unmeasured" in flags:
        assert "not measured here" in config.reason or "no measurement of this machine" in config.reason


def test_a_cpu_pick_with_every_setting_asked_for_a_gpu_on_a_busy_machine_still_fits() -> None:
    # Every qualifier at once leaves no room for the settings: the answer names precision and device, and the
    # Config lists the settings.
    best = timed("cpu", "bf16-mixed", 10.0)
    best = best.model_copy(update={"candidate": best.candidate.model_copy(update={
        "memory_format": "channels_last", "optimizer": "foreach", "compiled": True, "num_threads": 4})})
    config = decide(family("cnn", timed("cpu", "fp32", 100.0), best), prefer="gpu", digest=DIGEST)
    config = restate(config, noisy=True, older_rules="0.1.0",
                     origin="imported from results-of-the-whole-lab-2026.json (exported 2026-11-30)")
    assert one_sentence_problem(config.reason) is None, config.reason
    assert config.reason.startswith(answer_words(config.candidate.base))
    assert config.num_threads == 4 and config.compiled


def test_a_reason_that_fits_keeps_every_qualifier() -> None:
    config = restate(decide(family("cnn", timed("cpu", "fp32", 20.0), timed("cpu", "bf16-mixed", 10.0)),
                            digest=DIGEST), noisy=True, older_rules="0.1.0", origin="shipped in results.json")
    assert config.reason == ("bf16 mixed precision on the CPU: 2.0x faster per step than fp32 (measured 2026-11-30 "
                             "on a busy machine, under older rules), shipped in results.json")


def test_the_suites_reasons_are_recorded(reasons: list[str]) -> None:
    config = decide(family("cnn", timed("cpu", "fp32", 20.0), timed("cpu", "bf16-mixed", 10.0)), digest=DIGEST)
    assert reasons == [config.reason]


def test_the_reason_and_the_evidence_say_what_was_busy() -> None:
    from autotune._wording import qualifiers

    load = MachineLoad(stage=4, window_s=3.0, other_cores=0.95, steal=0.0,
                       processes=[ProcessLoad(name="python3", pid=4242, cores=0.91)])
    measured = family("cnn", timed("cpu", "fp32", 20.0), timed("cpu", "bf16-mixed", 10.0)).model_copy(
        update={"noisy": True, "noisy_because": ["other_processes"], "loads": [load]})
    config = decide(measured, digest=DIGEST)
    assert config.reason == ("bf16 mixed precision on the CPU: 2.0x faster per step than fp32 (measured 2026-11-30 "
                             "while python3 used 0.9 of a core; the next calibration measures it again)")
    assert config.evidence is not None
    assert qualifiers(config.evidence, init_scale=None) == [
        "measured while another process (python3, pid 4242) used 0.9 of a core: the next calibration measures it "
        "again"]
    kept = decide(measured.model_copy(update={"after_noisy": config.candidate}), digest=DIGEST)
    assert kept.reason == ("bf16 mixed precision on the CPU: 2.0x faster per step than fp32 (measured 2026-11-30 "
                           "while python3 used 0.9 of a core)")


_SPREAD = MachineLoad(stage=1, window_s=2.0, other_cores=1.4, steal=0.12, processes=[
    ProcessLoad(name="python3", pid=4242, cores=0.6), ProcessLoad(name="mypy", pid=77, cores=0.5)])
_QUIET = MachineLoad(stage=1, window_s=2.0, other_cores=0.01, steal=0.0)
_HOST = MachineLoad(stage=1, window_s=2.0, other_cores=0.8, processes=[
    ProcessLoad(name="python", pid=1000, cores=0.75, host=True)])


@pytest.mark.parametrize(("causes", "loads", "words"), [
    (["other_processes"], [_SPREAD],
     "while other processes used 1.4 cores (most: python3, pid 4242, 0.6 of a core)"),
    (["other_processes"], [_HOST], "while the process calibrating (python, pid 1000) used 0.8 of a core"),
    (["steal", "control_shift"], [_SPREAD],
     "while the hypervisor took 12% of the CPU time and the control workload's speed moved by 30%"),
    (["other_processes"], [], "while other processes took CPU time"),
    (["open_gap", "throttled"], [], "with a close call the final comparison left open, while a device throttled"),
    ([], [], "on a busy machine"),
    (["control_shift"], [_QUIET], "while the machine's speed moved by 30% with no other process running "
                                  "(its host, or its clock)"),
    (["control_shift"], [], "while the control workload's speed moved by 30%"),
], ids=["several-processes", "the-host-itself", "hypervisor-and-control", "no-windows-recorded",
        "the-measurements-own", "an-older-record", "the-os-saw-nothing-else", "no-os-view"])
def test_the_words_say_what_took_the_machine(causes: list[NoiseCause], loads: list[MachineLoad], words: str) -> None:
    assert noise_words(causes, loads, 0.3) == words


def test_a_shift_the_os_cannot_explain_is_not_called_busy() -> None:
    # The host under a virtual machine slows it with nothing running in it: "a quiet machine" is no advice.
    assert short_noise_words(["control_shift"], [_QUIET]) == "while the machine's speed moved"
    assert "quiet machine" not in remeasure_advice(["control_shift"], [_QUIET])
    assert short_noise_words(["other_processes", "control_shift"], [_SPREAD]) == "on a busy machine"
    assert "quiet machine" in remeasure_advice(["other_processes", "control_shift"], [_SPREAD])
