"""The numerics gate on real families with real numerical problems (BACKGROUND.md facts 5 and 7)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from samples import rival

import autotune
from autotune._answer import cached_families
from autotune._calibrate import measure_family
from autotune._records import FamilyResult

# These tests are about numerics, not isolation (test_failures covers the worker): skip its start-up.
pytestmark = pytest.mark.usefixtures("in_process")


def _measure(build: str) -> dict[str, FamilyResult]:
    autotune.register_family("numerics", f"families_for_tests:{build}")
    measured = measure_family("numerics")
    # Variants (layout, optimizer, threads) pass the same gate; none of these families should fail it there.
    variants = [r for r in measured.candidates if r.candidate != r.candidate.base]
    assert all(r.failure is None or r.failure.kind == "too_slow" for r in variants), variants
    return {r.candidate.precision: r for r in measured.candidates if r.candidate == r.candidate.base}  # type: ignore[misc]


def test_a_healthy_family_passes_in_every_precision() -> None:
    results = _measure("build_tiny")
    assert set(results) == {"fp32", "bf16-mixed", "fp16-mixed"}
    for result in results.values():
        assert result.failure is None
        assert result.numerics is not None and result.numerics.skipped_steps == 0


def test_fp16_overflowing_activations_reject_fp16_only() -> None:
    results = _measure("build_fp16_overflow")
    fp16 = results["fp16-mixed"]
    assert fp16.failure is not None and fp16.failure.kind == "numerics"
    assert "non-finite loss" in fp16.failure.detail
    assert results["bf16-mixed"].failure is None and results["fp32"].failure is None


def test_a_regression_that_bf16_cannot_resolve_picks_fp32() -> None:
    autotune.register_family("regression", "families_for_tests:build_precision_sensitive_regression")
    config = autotune.best_config("regression")
    assert config.precision == "fp32"
    bf16 = rival(config, "cpu bf16-mixed")
    assert bf16.verdict == "failed" and bf16.failure is not None and bf16.failure.kind == "numerics"
    assert bf16.failure.detail.startswith("bf16-mixed: loss after 8 steps")
    measured = cached_families(["regression"])["regression"]
    bf16 = next(r for r in measured.candidates if r.candidate.precision == "bf16-mixed")
    assert bf16.numerics is not None and bf16.numerics.loss_error > 1.0


def test_gradients_wrong_only_under_autocast_are_rejected() -> None:
    results = _measure("build_wrong_grad_under_autocast")
    assert results["fp32"].failure is None
    for precision in ("bf16-mixed", "fp16-mixed"):
        failure = results[precision].failure
        assert failure is not None and failure.kind == "numerics", precision


def test_fp16_overflow_in_the_first_steps_gets_a_lower_init_scale_not_a_rejection() -> None:
    fp16 = _measure("build_fp16_scale_overflow")["fp16-mixed"]
    assert fp16.failure is None
    assert fp16.numerics is not None
    assert fp16.numerics.init_scale == 1024.0
    assert fp16.numerics.default_scale_skipped is not None and fp16.numerics.default_scale_skipped >= 3
    assert fp16.numerics.skipped_steps == 0


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a loaded 2-core machine two threads stall each other for 10-100x a step, which
    stops candidates as too_slow before the gate speaks. (This process runs the calibration: in-process.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _gate_verdicts(results: dict[str, FamilyResult]) -> dict[str, str]:
    """What the gate said about each mixed precision: "passed" or the failure kind ("numerics")."""
    verdicts = {}
    for precision in ("bf16-mixed", "fp16-mixed"):
        failure = results[precision].failure  # type: ignore[attr-defined]
        verdicts[precision] = "passed" if failure is None else failure.kind
    return verdicts


@pytest.mark.usefixtures("one_thread")
def test_dropout_on_another_random_stream_passes_the_gate_when_the_math_is_equal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under autocast the family's dropout masks come from another stream than the fp32 reference's (as on a
    # GPU); the verification window runs without dropout, so only arithmetic is compared.
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    results = _measure("build_dropout_other_stream")
    assert results["fp32"].failure is None
    verdicts = _gate_verdicts(results)
    assert verdicts == {"bf16-mixed": "passed", "fp16-mixed": "passed"}


@pytest.mark.usefixtures("one_thread")
def test_dropout_on_another_random_stream_with_wrong_math_is_still_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    results = _measure("build_dropout_other_stream_wrong_math")
    assert results["fp32"].failure is None
    verdicts = _gate_verdicts(results)
    assert verdicts == {"bf16-mixed": "numerics", "fp16-mixed": "numerics"}
