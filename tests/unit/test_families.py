from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import autotune
from autotune import FamilyRegistrationError, UnknownFamilyError


@pytest.mark.parametrize("name", ["tiny_mlp", "mlp", "cnn", "transformer"])
def test_builtin_families_build_a_trainable_workload(name: str) -> None:
    workload = autotune.get_family(name).build()
    loss = workload.loss(workload.model, workload.inputs)
    loss.backward()
    workload.optimizer(workload.model.parameters()).step()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(t.device.type == "cpu" for t in workload.inputs)


def test_tiny_mlp_is_the_gesture_classifier() -> None:
    workload = autotune.get_family("tiny_mlp").build()
    assert workload.inputs[0].shape[1] == 63


def test_unknown_family_suggests_the_closest_name() -> None:
    with pytest.raises(UnknownFamilyError) as info:
        autotune.get_family("cnm")
    message = str(info.value)
    assert "did you mean 'cnn'?" in message
    assert "cnn, mlp, tiny_mlp, transformer" in message
    assert isinstance(info.value, autotune.AutotuneError)


@pytest.mark.parametrize("name", ["CNN", "Tiny_MLP", "Transformr"])
def test_suggestions_ignore_case(name: str) -> None:
    with pytest.raises(UnknownFamilyError, match=f"did you mean '{name.lower().replace('transformr', 'transformer')}'"):
        autotune.best_config(name)


@pytest.mark.parametrize("name", [None, 123, ["cnn"], b"cnn"])
def test_a_model_kind_that_is_no_string_is_a_type_error_that_prints(name: object) -> None:
    with pytest.raises(TypeError) as info:
        autotune.best_config(name)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"a model kind is a name such as 'cnn', got {type(name).__name__} {name!r}; "
                                      "known: cnn, mlp, tiny_mlp, transformer")


@pytest.mark.parametrize("call", [autotune.calibrate, autotune.start_calibration])
def test_one_kind_given_where_a_list_goes_says_so(call: object) -> None:
    with pytest.raises(TypeError, match=r"takes a list of model kinds: \w+\(\['cnn'\]\)"):
        call("cnn")  # type: ignore[operator]


def test_the_reference_and_the_signature_name_the_kind_alike() -> None:
    """The reference's calls are the signatures: its table lists every keyword best_config takes."""
    reference = (Path(__file__).parents[2] / "docs" / "reference" / "api.md").read_text()
    parameters = list(inspect.signature(autotune.best_config).parameters)
    assert parameters[0] == "model_kind"
    assert f"autotune.best_config({parameters[0]}, *, " in reference
    row = next(line for line in reference.splitlines() if line.startswith("| `autotune.best_config("))
    assert all(f"{name}=" in row for name in parameters[1:]), row


def top_level_build() -> autotune.Workload:
    return autotune.get_family("tiny_mlp").build()


def test_register_a_top_level_function_by_reference() -> None:
    family = autotune.register_family("mine", top_level_build)
    assert family.ref == f"{__name__}:top_level_build"
    assert isinstance(autotune.get_family("mine").build(), autotune.Workload)


def test_register_a_module_function_string() -> None:
    family = autotune.register_family("mine", "families_for_tests:build_tiny")
    assert family.build().model is not None


def test_lambda_is_refused_with_what_to_do() -> None:
    with pytest.raises(FamilyRegistrationError, match="lambda or a nested function.*top level of a module"):
        autotune.register_family("mine", lambda: top_level_build())


def test_closure_is_refused() -> None:
    def nested() -> autotune.Workload:
        return top_level_build()

    with pytest.raises(FamilyRegistrationError, match="spawned worker"):
        autotune.register_family("mine", nested)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param("no_colon", "form 'package.module:function'", id="no-colon"),
        pytest.param("no_such_module_xyz:f", "cannot import", id="missing-module"),
        pytest.param("families_for_tests:missing", "cannot import", id="missing-function"),
        pytest.param(42, "function or 'module:function'", id="not-callable"),
    ],
)
def test_bad_references_are_refused(build: object, message: str) -> None:
    with pytest.raises(FamilyRegistrationError, match=message):
        autotune.register_family("mine", build)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "../escape", "a/b", "x" * 65, "with space"])
def test_names_that_could_escape_the_cache_dir_are_refused(name: str) -> None:
    with pytest.raises(FamilyRegistrationError):
        autotune.register_family(name, top_level_build)


def test_build_must_return_a_workload() -> None:
    autotune.register_family("bad", "families_for_tests:build_not_a_workload")
    with pytest.raises(FamilyRegistrationError, match="returned tuple, expected autotune.Workload"):
        autotune.get_family("bad").build()
