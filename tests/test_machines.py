"""Machines that are not here: recorded fixtures read as truth profiles, measured by the real search on a
fake clock, decided by the real decision code (a seeded run each; rates over many runs are
benchmarks/decision_sim.py's)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from samples import rival

from autotune._cache.store import SCHEMA_VERSION, StoreFile
from autotune._config import Config
from autotune._decide import decide
from autotune._records import Candidate
from autotune.testing.simulate import simulate
from autotune.testing.truth import truth_from_record

MACHINES = Path(__file__).parent.parent / "fixtures" / "machines"


def machine(name: str) -> StoreFile:
    return StoreFile.model_validate_json((MACHINES / f"{name}.json").read_bytes())


def pick(name: str, kind: str, seed: int = 0, **kwargs: object) -> Config:
    stored = machine(name)
    measured, _ = simulate(truth_from_record(stored.families[kind], default_threads=8), seed)
    return decide(measured, digest=stored.fingerprint.digest, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", sorted(MACHINES.glob("*.json")), ids=lambda p: p.stem)
def test_every_fixture_is_a_valid_results_file_that_says_where_it_comes_from(path: Path) -> None:
    stored = machine(path.stem)
    assert stored.schema_version == SCHEMA_VERSION
    assert stored.note
    assert stored.fingerprint.accelerators


def test_a_recorded_variant_gain_reaches_the_truth_of_its_own_candidate_only() -> None:
    truth = truth_from_record(machine("rtx-3090-i9").families["cnn"], default_threads=8)
    fp16, fp32 = Candidate(device="cuda:0", precision="fp16-mixed"), Candidate(device="cuda:0", precision="fp32")
    cpu = Candidate(device="cpu", precision="fp32")
    # timm's RTX 3090 AMP training benchmark, resnet18: 146.713 ms/step channels_last vs 184.877 contiguous
    assert truth.step_ms(fp16.model_copy(update={"memory_format": "channels_last"})) == pytest.approx(
        truth.step_ms(fp16) * 146.713 / 184.877)
    assert truth.step_ms(fp32.model_copy(update={"memory_format": "channels_last"})) == truth.step_ms(fp32)
    # deepmd-kit's fused Adam: 892 vs 922 ms/step
    fused = fp32.model_copy(update={"optimizer": "fused"})
    assert truth.step_ms(fused) == pytest.approx(truth.step_ms(fp32) * 892 / 922)
    assert truth.step_ms(cpu.model_copy(update={"optimizer": "fused"})) == truth.step_ms(cpu)
    assert truth.facts.image_inputs  # a recorded channels_last result: the workload had 4-D inputs


def test_m1_trains_the_tiny_mlp_on_the_cpu() -> None:
    config = pick("apple-m1", "tiny_mlp")
    assert (config.device, config.precision) == ("cpu", "fp32")
    assert re.search(r"on the CPU: [89]\.\dx faster per step than mps", config.reason)
    assert rival(config, "mps fp32").verdict == "outpaced"


def test_m1_trains_the_cnn_on_metal_in_fp32() -> None:
    config = pick("apple-m1", "cnn")
    assert (config.device, config.precision) == ("mps", "fp32")
    # fp16 is 1.06x slower: dropped with its evidence, or a tie the simpler fp32 wins (measured against fp32 with
    # the fused AdamW once that variant leads)
    fp16, bf16 = rival(config, "mps fp16-mixed"), rival(config, "mps bf16-mixed")
    assert fp16.verdict in ("dropped", "tie") and fp16.ratio is not None and 1.0 <= fp16.ratio.estimate < 1.2
    assert bf16.verdict == "dropped" and bf16.ratio is not None and 1.6 <= bf16.ratio.estimate < 1.8
    assert bf16.against is not None and bf16.against.label.startswith("mps fp32")


def test_m1_user_choosing_gpu_gets_metal_with_the_honest_reason() -> None:
    config = pick("apple-m1", "tiny_mlp", prefer="gpu")
    assert config.device == "mps"
    assert re.search(r"fp32 (with the fused optimizer )?on mps: as requested, though the CPU is [89]\.\dx faster",
                     config.reason)
    assert rival(config, "cpu fp32").verdict == "faster"


def test_m1_short_detection_job_finishes_first_on_the_cpu() -> None:
    assert pick("apple-m1", "detector").device == "mps"
    config = pick("apple-m1", "detector", expected_steps=60)
    assert config.device == "cpu"
    assert re.search(r"finishes 60 steps first: mps's set-up of 6\d s outweighs its faster steps", config.reason)
    mps = rival(config, "mps fp32")
    assert mps.verdict == "finishes later" and mps.setup_s is not None and 60 <= mps.setup_s < 70


def test_3090_tiny_mlp_on_the_cpu_cnn_on_cuda_bf16() -> None:
    assert pick("rtx-3090-i9", "tiny_mlp").device == "cpu"
    config = pick("rtx-3090-i9", "cnn")
    assert (config.device, config.precision) == ("cuda:0", "bf16-mixed")
    assert "faster per step than the CPU" in config.reason


@pytest.mark.parametrize("kind", ["cnn", "detector", "transformer"])
@pytest.mark.parametrize("prefer", ["auto", "gpu"])
def test_2070_never_picks_emulated_bf16(kind: str, prefer: str) -> None:
    config = pick("rtx-2070", kind, prefer=prefer)
    assert config.precision != "bf16-mixed"
    # bf16 is in the evidence with its measured cost: 4.35x slower than fp32, more against fp16
    bf16 = rival(config, "cuda:0 bf16-mixed")
    assert (bf16.verdict, bf16.rounds, bf16.far_behind) == ("dropped", 1, True)
    assert bf16.ratio is not None and 4 <= bf16.ratio.estimate < 10
    assert bf16.against is not None and bf16.against.precision in ("fp32", "fp16-mixed")


def test_2070_fp16_detector_starts_gradscaler_lower() -> None:
    config = pick("rtx-2070", "detector")
    assert (config.precision, config.init_scale) == ("fp16-mixed", 1024.0)
    # of its verification window: 8 steps for a plain candidate, 4 for a variant (here a fused optimizer)
    assert config.evidence is not None and config.evidence.default_scale_skipped == 4
    assert config.evidence.verified_steps in (4, 8)


def test_2070_transformer_with_fp16_rejected_uses_fp32_and_says_why() -> None:
    config = pick("rtx-2070", "transformer")
    assert (config.device, config.precision) == ("cuda:0", "fp32")
    fp16 = rival(config, "cuda:0 fp16-mixed")
    assert fp16.verdict == "failed" and fp16.failure is not None and fp16.failure.kind == "numerics"


def test_3080_laptop_input_bound_mixed_precision_is_a_tie_and_fp32_wins() -> None:
    config = pick("rtx-3080-laptop", "classifier")
    assert (config.device, config.precision) == ("cuda:0", "fp32")
    assert re.search(r"on cuda:0: \d\.\dx faster per step than the CPU, (bf16|fp16) mixed precision"
                     r"( with [^,]+?)? was no faster", config.reason)
    bf16 = rival(config, "cuda:0 bf16-mixed")
    assert (bf16.verdict, bf16.margin) == ("tie", 0.03)


def test_3080_laptop_a_real_117x_gain_is_taken() -> None:
    assert pick("rtx-3080-laptop", "detector").precision == "bf16-mixed"


def test_3080_laptop_short_job_stays_on_the_cpu() -> None:
    assert pick("rtx-3080-laptop", "mlp").device == "cuda:0"
    config = pick("rtx-3080-laptop", "mlp", expected_steps=60)
    assert config.device == "cpu"
    assert re.search(r"cuda:0's set-up of 4\.1 s outweighs its faster steps", config.reason)
    assert config.evidence is not None
    assert "finishes later" in {r.verdict for r in config.evidence.rivals if r.candidate.device == "cuda:0"}


def test_prefer_cpu_on_a_gpu_machine_is_respected(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autotune"):
        config = pick("rtx-3090-i9", "cnn", prefer="cpu")
    assert config.device == "cpu"
    assert "CUDA" not in caplog.text
