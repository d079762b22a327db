"""What makes stored measurements stale: a family's key (build, version=, search, budget, schema), the rules they
were measured by, and transient failures after their cool-off. Real calibrations, in-process and with the
smallest search, to stay fast."""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from samples import failed, family, timed

import autotune
from autotune import _cli
from autotune._answer import cached_families
from autotune._cache.freshness import (
    RETRY_AFTER,
    TRANSIENT,
    family_key,
    freshness,
    retry_at,
    rules_digest,
)
from autotune._cache.lookup import store
from autotune._families import get_family
from autotune._records import FamilyResult


@pytest.fixture(autouse=True)
def quick(in_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.2")


def _measured_at(kind: str) -> str:
    return cached_families([kind])[kind].measured_at


def _two_families() -> dict[str, str]:
    autotune.register_family("tiny", "families_for_tests:build_tiny")
    autotune.register_family("other", "families_for_tests:build_tiny_with_sgd")
    autotune.calibrate(["tiny", "other"])
    return {kind: _measured_at(kind) for kind in ("tiny", "other")}


@pytest.mark.parametrize(
    "change",
    ["version", "build", "search", "budget"],
)
def test_a_key_change_measures_that_family_again_and_only_it(
    change: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = _two_families()
    if change == "version":
        autotune.register_family("tiny", "families_for_tests:build_tiny", version="2")
    elif change == "build":
        autotune.register_family("tiny", "families_for_tests:build_tiny_cnn")
    elif change == "search":
        monkeypatch.setenv("AUTOTUNE_SEARCH", "default")
    else:
        monkeypatch.setenv("AUTOTUNE_BUDGET_S", "0.25")
    with caplog.at_level(logging.INFO, logger="autotune"):
        config = autotune.best_config("tiny")
    assert config.source == "measured"
    assert _measured_at("tiny") != before["tiny"], f"another {change} was answered from the old measurements"
    assert "measuring tiny again: it was measured for another" in caplog.text
    assert cached_families(["other"])["other"].measured_at == before["other"], "the other family is untouched"
    if change in ("version", "build"):
        # the other family still answers from the cache: no calibration for it
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="autotune"):
            autotune.best_config("other")
        assert "calibrating" not in caplog.text


def test_the_same_key_is_answered_from_the_cache() -> None:
    before = _two_families()
    autotune.register_family("tiny", "families_for_tests:build_tiny")  # registered again, same build
    autotune.best_config("tiny")
    assert _measured_at("tiny") == before["tiny"]


def _stored(kind: str, *, hours_ago: float, failure_kind: str) -> FamilyResult:
    """A record of ``kind`` as a calibration ``hours_ago`` left it: cpu bf16 failed with ``failure_kind``."""
    at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours_ago)
    result = family(kind, timed("cpu", "fp32", 1.0), failed("cpu", "bf16-mixed", failure_kind, "it happened"))
    result = result.model_copy(update={"measured_at": at.isoformat(), "key": family_key(get_family(kind))})
    store().save(autotune.fingerprint(), result)
    return result


@pytest.mark.parametrize(
    ("failure_kind", "hours_ago", "retried"),
    [
        pytest.param("oom", 25, True, id="oom-after-a-day"),
        pytest.param("timeout", 25, True, id="timeout-after-a-day"),
        pytest.param("crashed", 25, True, id="crash-after-a-day"),
        pytest.param("oom", 1, False, id="oom-within-the-cool-off"),
        pytest.param("numerics", 24 * 400, False, id="numerics-stays"),
        pytest.param("unsupported", 24 * 400, False, id="unsupported-stays"),
    ],
)
def test_transient_failures_are_retried_after_a_day(
    tiny_family: str, failure_kind: str, hours_ago: float, retried: bool
) -> None:
    stored = _stored(tiny_family, hours_ago=hours_ago, failure_kind=failure_kind)
    autotune.best_config(tiny_family)
    assert (_measured_at(tiny_family) != stored.measured_at) is retried


def test_force_retries_a_transient_failure_at_once(tiny_family: str) -> None:
    stored = _stored(tiny_family, hours_ago=1, failure_kind="oom")
    autotune.calibrate([tiny_family], force=True)
    assert _measured_at(tiny_family) != stored.measured_at


def test_calibrate_retries_what_is_due_and_keeps_the_rest(tiny_family: str) -> None:
    autotune.register_family("other", "families_for_tests:build_tiny_with_sgd")
    due = _stored(tiny_family, hours_ago=30, failure_kind="timeout")
    kept = _stored("other", hours_ago=30, failure_kind="numerics")
    autotune.calibrate([tiny_family, "other"])
    assert _measured_at(tiny_family) != due.measured_at
    assert _measured_at("other") == kept.measured_at


def test_without_calibration_a_due_retry_still_answers_from_the_measurements(tiny_family: str) -> None:
    stored = _stored(tiny_family, hours_ago=30, failure_kind="oom")
    config = autotune.best_config(tiny_family, calibrate_on_miss=False)
    assert config.source == "measured" and _measured_at(tiny_family) == stored.measured_at


@pytest.mark.parametrize("kind", ["timeout", "crashed", "oom", "unsupported", "numerics", "error", "too_slow"])
def test_only_transient_kinds_have_a_retry_time(kind: str) -> None:
    result = family("x", timed("cpu", "fp32", 1.0), failed("cpu", "bf16-mixed", kind, "d"))
    at = retry_at(result, result.candidates[1])
    measured = dt.datetime.fromisoformat(result.measured_at)
    assert at == (measured + RETRY_AFTER if kind in TRANSIENT else None)
    key = family_key(get_family("tiny_mlp"))
    keyed = result.model_copy(update={"key": key, "rules": rules_digest()})
    later = measured + dt.timedelta(days=2)
    assert freshness(keyed, key, later).state == ("retry" if kind in TRANSIENT else "fresh")


def test_explain_says_when_each_failure_is_retried(tiny_family: str, capsys: pytest.CaptureFixture[str]) -> None:
    stored = _stored(tiny_family, hours_ago=1, failure_kind="oom")
    assert _cli.main(["--explain", tiny_family]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table folds long cells
    at = dt.datetime.fromisoformat(stored.measured_at) + RETRY_AFTER
    assert f"retried after {at:%Y-%m-%d %H:%M} UTC" in out
    _stored(tiny_family, hours_ago=1, failure_kind="numerics")
    assert _cli.main(["--explain", tiny_family]) == 0
    assert "kept until the machine" in " ".join(capsys.readouterr().out.split())


def test_a_family_this_version_cannot_read_is_measured_again_and_the_other_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import json

    before = _two_families()
    path = store().path(autotune.fingerprint().digest)
    document = json.loads(path.read_text())
    document["families"]["tiny"]["candidates"][0]["candidate"]["precision"] = "fp8-mixed"  # a newer version's
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.INFO, logger="autotune"):
        autotune.best_config("other")
        assert "calibrating" not in caplog.text
        autotune.best_config("tiny")
    assert "calibrating tiny" in caplog.text and "'tiny' is measured again when next asked for" in caplog.text
    assert _measured_at("tiny") != before["tiny"] and _measured_at("other") == before["other"]


def test_the_rules_digest_is_derived_from_the_settings_and_the_rule_constants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune import _rules
    from autotune._lab import looks, protocol

    digest = rules_digest()
    code = "from autotune._cache.freshness import rules_digest; print(rules_digest())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == digest, "the same in every process"
    with monkeypatch.context() as patched:
        patched.setattr(_rules, "MARGIN", 0.04)
        assert rules_digest() != digest, "a changed constant"
    with monkeypatch.context() as patched:
        patched.setattr(looks, "STOP_EARLY", True, raising=False)
        assert rules_digest() != digest, "a new constant"

    class LongerVerification(protocol.CalibrationSettings):
        verify_steps: int = 9

    with monkeypatch.context() as patched:
        patched.setattr(protocol, "CalibrationSettings", LongerVerification)
        assert rules_digest() != digest, "a settings default"
    assert rules_digest() == digest


#: the worker package's modules that shape no calibration: the other tools' jobs and the worker's plumbing, its host
#: side (``host``) included (``protocol``'s settings count by their defaults)
NOT_RULES = {"autotune._lab.child", "autotune._lab.copies", "autotune._lab.entry", "autotune._lab.max_batch",
             "autotune._lab.protocol", "autotune._lab.check", "autotune._lab.trace", "autotune._lab.host"}


def test_every_module_of_the_worker_package_is_named_as_a_rule_module_or_not() -> None:
    import pkgutil

    from autotune import _lab
    from autotune._rules import RULE_MODULES

    found = {f"autotune._lab.{m.name}" for m in pkgutil.iter_modules(_lab.__path__)}
    assert found == {name for name in RULE_MODULES if name.startswith("autotune._lab.")} | NOT_RULES, (
        "a new module of autotune/_lab/ goes into _rules.RULE_MODULES or, if no constant of it shapes a "
        "calibration, into NOT_RULES here")


#: what a warm ``best_config`` never loads: the calibration, the worker, the tools, the guard, the ranks' agreement,
#: the framework adapters and the frameworks themselves
COLD = ("autotune._lab", "autotune._calibrate", "autotune._background", "autotune._tools",
        "autotune._guard", "autotune._ranks.agree", "autotune._ranks.job", "autotune._frameworks", "lightning",
        "pytorch_lightning", "accelerate")


def test_a_fresh_process_answers_from_the_cache_without_anything_cold(tiny_family: str, in_process: None) -> None:
    autotune.calibrate([tiny_family])
    code = ("import sys, autotune; sys.path.insert(0, sys.argv[1]);"
            "autotune.register_family('tiny', 'families_for_tests:build_tiny');"
            "config = autotune.best_config('tiny');"
            "print(config.source, 'older rules' in config.reason);"
            "print(*sorted(sys.modules))")
    for _ in range(2):  # the calibration remembered the rules digest for these files; each process reads it
        out = subprocess.run([sys.executable, "-c", code, str(_tests_dir())], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        assert out[0] == "measured False", out
        cold = sorted(m for m in out[1].split() if any(m == room or m.startswith(room + ".") for room in COLD))
        assert not cold, f"a warm best_config loaded {cold}"


def test_the_record_classes_a_warm_answer_reads_are_built_once_at_import() -> None:
    # One that names a class defined after it is left unbuilt: the classes holding it build its schema inline, and it
    # is built again on first use, on the warm path (Evidence naming Demotion did).
    code = ("import autotune._config, pydantic;"
            "every = lambda c: [d for s in c.__subclasses__() for d in (s, *every(s))];"
            "print(*sorted({c.__qualname__ for c in every(pydantic.BaseModel) if not c.__pydantic_complete__}))")
    assert _run(code) == ""


def test_a_remembered_rules_digest_is_used_only_for_the_files_it_was_computed_from() -> None:
    code = "from autotune._cache.freshness import rules_digest; print(rules_digest())"
    digest = rules_digest()
    remembered = store().root / "rules.digest"
    assert remembered.exists(), "remembered by a process that loaded the rule modules"
    remembered.unlink()
    assert _run(code) == digest and remembered.exists(), "remembered by one that had to load them"
    stamp, _ = remembered.read_text().split()
    remembered.write_text(f"{stamp} 0000000000000000\n")
    assert _run(code) == "0000000000000000", "read back, not recomputed"
    remembered.write_text("not-these-files 0000000000000000\n")
    assert _run(code) == digest, "another installation's digest is not used"
    remembered.write_text("garbage")
    assert _run(code) == digest


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _tests_dir() -> Path:
    return Path(__file__).parents[1]


def test_a_calibration_records_the_rules_it_measured_by(tiny_family: str) -> None:
    autotune.calibrate([tiny_family])
    assert cached_families([tiny_family])[tiny_family].rules == rules_digest()



def test_a_result_measured_under_older_rules_serves_best_config_and_the_next_calibrate_measures_it_again(
    tiny_family: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from autotune import _rules

    stored = _stored(tiny_family, hours_ago=1, failure_kind="numerics")
    monkeypatch.setattr(_rules, "MARGIN", 0.04)  # an upgrade changed the margin
    config = autotune.best_config(tiny_family)
    assert config.source == "measured" and _measured_at(tiny_family) == stored.measured_at, "served, not measured"
    assert config.reason.endswith(f"(measured {stored.measured_at[:10]} under older rules; the next calibration "
                                  "measures it again)")
    assert config.evidence is not None and config.evidence.older_rules == "test"
    with caplog.at_level(logging.INFO, logger="autotune"):
        autotune.calibrate([tiny_family])
    assert "measuring tiny again: it was measured under older rules" in caplog.text
    assert _measured_at(tiny_family) != stored.measured_at
    assert cached_families([tiny_family])[tiny_family].rules == rules_digest()


def test_a_result_under_these_rules_is_kept_and_one_stored_before_results_recorded_their_rules_is_not(
    tiny_family: str,
) -> None:
    autotune.register_family("other", "families_for_tests:build_tiny_with_sgd")
    older = _stored(tiny_family, hours_ago=1, failure_kind="numerics").model_copy(update={"rules": None})
    store().save(autotune.fingerprint(), older)
    kept = _stored("other", hours_ago=1, failure_kind="numerics")
    assert "older rules" not in autotune.best_config("other").reason
    autotune.calibrate([tiny_family, "other"])
    assert _measured_at(tiny_family) != older.measured_at
    assert _measured_at("other") == kept.measured_at


def test_a_noisy_result_is_measured_again_once_until_the_rules_or_the_key_change(tiny_family: str) -> None:
    from autotune._cache.freshness import now_utc
    from autotune._records import FP32_CPU

    key, now = family_key(get_family(tiny_family)), now_utc()
    noisy = family(tiny_family, timed("cpu", "fp32", 10.0), noisy=True)
    assert freshness(noisy, key, now).state == "noisy"
    again = noisy.model_copy(update={"after_noisy": FP32_CPU})  # the re-measurement, busy too: kept
    assert freshness(again, key, now).final
    assert freshness(again.model_copy(update={"rules": "0" * 16}), key, now).state == "older_rules"
    assert freshness(again, key.model_copy(update={"budget_s": 9.0}), now).state == "other_key"


def test_a_noisy_result_says_why_it_is_measured_again(tiny_family: str) -> None:
    from autotune._cache.freshness import now_utc
    from autotune._records import MachineLoad

    key, now = family_key(get_family(tiny_family)), now_utc()
    noisy = family(tiny_family, timed("cpu", "fp32", 10.0), noisy=True)
    assert freshness(noisy, key, now).why == "it was measured on a busy machine"
    # The control moved while the operating system saw nothing else run: the machine's host, not a busy machine.
    host = noisy.model_copy(update={"noisy_because": ["control_shift"],
                                    "loads": [MachineLoad(window_s=2.0, other_cores=0.0, steal=0.0)]})
    assert freshness(host, key, now).why == "it was measured while the machine's speed moved"
