"""The variant axes as one table: every setting of every row reaches torch in the timed step and in
``Config.prepare``, and keeps its words, its rank and its place in the records."""

from __future__ import annotations

import math
from typing import Any, get_args

import pytest
import torch
from families_for_tests import build_tiny_cnn, build_tiny_with_sgd

from autotune import Config, Family, _variants
from autotune._apply import axes
from autotune._apply import fp32 as _fp32
from autotune._lab.step import TrainStep
from autotune._records import Candidate, Choice
from autotune._rules import complexity, preference
from autotune._variants import AXES, Axis, Facts, Situation
from autotune.backends import backend_for

_EVERYTHING = Situation(facts=Facts(image_inputs=True, default_optimizer=True), device="cpu", search="extended",
                        default_threads=4)


def _settings() -> list[tuple[Axis[Any], Any]]:
    """Every non-default setting of every axis: what the search proposes, and each value its field's type lists."""
    settings: list[tuple[Axis[Any], Any]] = []
    for axis in AXES:
        listed = [v for v in get_args(Choice.model_fields[axis.field].annotation) if not isinstance(v, type)]
        for value in dict.fromkeys([*axis.propose(_EVERYTHING), *listed]):
            if value != axis.default:
                settings.append((axis, value))
    return settings


SETTINGS = _settings()
IDS = [f"{axis.field}={value}" for axis, value in SETTINGS]
_FAMILY = Family("tiny_cnn", "families_for_tests:build_tiny_cnn")


def test_the_table_names_each_choice_field_once_with_its_default_and_its_torch_side() -> None:
    fields = [axis.field for axis in AXES]
    assert fields == [name for name in Choice.model_fields if name not in ("device", "precision")]
    assert {name: Choice.model_fields[name].default for name in fields} == {a.field: a.default for a in AXES}
    assert set(axes.APPLY) == set(fields)
    # Candidates as stored before the table keep their field names, settings and defaults.
    plain = {"device": "cpu", "precision": "fp32", "memory_format": "contiguous", "optimizer": "default",
             "num_threads": None, "compiled": False}
    assert plain.items() <= Candidate(device="cpu", precision="fp32").model_dump(mode="json").items()
    stored = {**plain, "memory_format": "channels_last", "optimizer": "fused", "num_threads": 1, "compiled": True}
    assert stored.items() <= Candidate.model_validate(stored).model_dump(mode="json").items()


@pytest.mark.parametrize(("axis", "value"), SETTINGS, ids=IDS)
def test_a_setting_keeps_its_words_rank_and_record(axis: Axis[Any], value: Any) -> None:
    candidate = Candidate(device="cpu", precision="fp32", **{axis.field: value})
    assert Candidate.model_validate_json(candidate.model_dump_json()) == candidate
    assert candidate.variants == [axis.label(value)] and candidate.label == f"cpu fp32 {axis.label(value)}"
    assert _variants.prose(candidate) == [axis.prose(value)]
    assert complexity(candidate) == (0, 1)
    assert (preference(candidate) > preference(candidate.base)) is axis.preferred


def _seen(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...],
          forward: torch.nn.Module) -> tuple[object, ...]:
    """What torch sees of a set-up: parameter and batch layouts, optimizer settings, the forward, the threads."""
    settings = {k: v for k, v in optimizer.defaults.items() if k in ("foreach", "fused")}
    return (tuple(p.is_contiguous() for p in model.parameters()), tuple(t.is_contiguous() for t in batch),
            settings, type(forward), torch.get_num_threads())


def _step_seen(candidate: Candidate) -> tuple[object, ...]:
    step = TrainStep(_FAMILY, candidate, backend_for("cpu"), seed=0, fp32_host=_fp32.current())
    batch = step.batch()
    with step.selected():
        seen = _seen(step.model, step.optimizer, batch, step.forward)
        if step.forward is step.model:  # a compiled forward compiles in its first step: the extended search runs it
            step.run()
    return seen


def _prepared_seen(config: Config) -> tuple[object, ...]:
    workload = build_tiny_cnn()
    model, optimizer = config.prepare(workload.model, torch.optim.AdamW, lr=1e-3)
    batch = config.prepare_batch(workload.inputs)
    before = torch.get_num_threads()
    config.apply_threads()
    try:
        original = model._orig_mod if hasattr(model, "_orig_mod") else model
        return _seen(original, optimizer, batch, model)  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("axis", "value"), SETTINGS, ids=IDS)
def test_a_setting_reaches_torch_in_the_timed_step_and_in_prepare(axis: Axis[Any], value: Any) -> None:
    torch.set_num_threads(threads := _EVERYTHING.default_threads)  # torch's own count, as the proposals assumed
    candidate = Candidate(device="cpu", precision="fp32", **{axis.field: value})
    assert _step_seen(candidate) != _step_seen(candidate.base)
    assert torch.get_num_threads() == threads  # a step's process-wide settings end with its block

    def config(choice: Candidate) -> Config:
        return Config(model_kind="tiny_cnn", source="measured", reason="test", fingerprint_digest="d",
                      **choice.model_dump())

    assert _prepared_seen(config(candidate)) != _prepared_seen(config(candidate.base))


def test_facts_come_from_the_built_workload() -> None:
    assert axes.facts(build_tiny_cnn()) == Facts(image_inputs=True, default_optimizer=True)
    assert axes.facts(build_tiny_with_sgd()) == Facts(image_inputs=False, default_optimizer=False)


def test_the_reachable_space_holds_every_combination_of_the_proposed_settings_once() -> None:
    base = Candidate(device="cpu", precision="bf16-mixed")
    space = _variants.reachable(base, _EVERYTHING)
    assert len(space) == len(set(space)) == math.prod(1 + len(axis.propose(_EVERYTHING)) for axis in AXES)
    assert base in space and {c.base for c in space} == {base}
