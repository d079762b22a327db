"""Batches as loaders hand them: a Hugging Face ``BatchEncoding``, nested lists and named tuples, dataclasses, with
plain values beside the tensors, calibrate as a tuple does; what no device takes is refused by its path."""

from __future__ import annotations

import pytest
import torch
from families_for_tests import Images, TokenBatch

import autotune
from autotune import FamilyRegistrationError
from autotune._lab.probe import probe_batch


def test_a_hugging_face_batch_encoding_calibrates_in_the_worker() -> None:
    # The worker is the subject: the BatchEncoding is built there, and crosses nothing but the family's build.
    autotune.register_family("bert_encoding", "families_for_tests:build_bert_encoding")
    measured = autotune.calibrate(["bert_encoding"]).measurements["bert_encoding"]
    assert any(result.usable for result in measured.candidates), measured.candidates
    config = autotune.best_config("bert_encoding", wait=False)
    assert config.source == "measured"


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("build", ["build_nested_batch", "build_dataclass_batch"])
def test_nested_and_dataclass_batches_calibrate(build: str) -> None:
    autotune.register_family("batch", f"families_for_tests:{build}")
    assert autotune.best_config("batch").source == "measured"


@pytest.mark.usefixtures("in_process")
def test_images_inside_a_nested_batch_make_channels_last_worth_trying() -> None:
    autotune.register_family("nested", "families_for_tests:build_nested_batch")
    measured = autotune.calibrate(["nested"]).measurements["nested"]
    tried = [result for result in measured.candidates if result.candidate.memory_format == "channels_last"]
    assert tried and all(result.failure is None for result in tried), tried


def test_a_batch_holding_what_no_device_takes_is_refused_by_its_path() -> None:
    autotune.register_family("numpy_batch", "families_for_tests:build_numpy_in_batch")
    with pytest.raises(FamilyRegistrationError, match=r"inputs\['features'\] is a numpy.ndarray, not a tensor"):
        autotune.get_family("numpy_batch").build()


@pytest.mark.parametrize(("batch", "size"), [
    ({"input_ids": torch.zeros(16, 12), "attention_mask": torch.zeros(16, 12), "labels": torch.zeros(16)}, 2),
    ([Images(torch.zeros(32, 3, 8, 8), torch.zeros(32)), torch.zeros(32)], 4),
    (TokenBatch(torch.zeros(16, 6), torch.zeros(16), "train", 3), 2),
    ({"input_ids": torch.zeros(16, 12), "labels": torch.zeros(8)}, None),  # two batch sizes: none to probe with
    ([Images(torch.zeros(32, 3, 8, 8), torch.zeros(())), torch.zeros(32)], None),
], ids=["dict", "nested", "dataclass", "sizes-disagree", "a-0-d-tensor"])
def test_the_probe_reads_the_batch_size_off_every_tensor(batch: object, size: int | None) -> None:
    assert probe_batch(batch) == size
