"""``--family NAME=package.module:function`` on the command line, and kinds measured by other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import samples

import autotune
from autotune._answer import cached_configs, cached_families
from autotune._cache.store import Store
from autotune._cli import main

TESTS = str(Path(__file__).parents[1])


def _builtins_measured(cache: Path) -> None:
    """The built-ins in the cache, so the table has nothing to calibrate but what a test asks for."""
    store = Store(cache)
    for kind in ("tiny_mlp", "mlp", "cnn", "transformer"):
        store.save(autotune.fingerprint(), samples.family(kind, samples.timed("cpu", "fp32", 1.0)))


def test_a_kind_registered_by_another_process_is_listed_and_explained_here(
    isolated_autotune: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "PYTHONPATH": TESTS, "AUTOTUNE_SEARCH": "precision"}
    proc = subprocess.run([sys.executable, "-m", "autotune", "--family", "mine=families_for_tests:build_tiny",
                           "--json"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["configs"]["mine"]["source"] == "measured"

    with pytest.raises(autotune.UnknownFamilyError):
        autotune.get_family("mine")  # not registered in this process ...
    assert cached_configs()["mine"].source == "measured"  # ... yet its decision is in the cache
    _builtins_measured(isolated_autotune)
    Store(isolated_autotune).save(autotune.fingerprint(), samples.family(  # another app's kind that nothing trains
        "broken", samples.failed("cpu", "fp32", "error", "ValueError: bad model")))
    monkeypatch.setenv("COLUMNS", "200")
    assert main([]) == 0
    table = capsys.readouterr().out
    assert all(kind in table for kind in ("tiny_mlp", "transformer", "mine"))
    assert "broken: measured here, but no candidate could train it" in table
    assert main(["--explain", "mine"]) == 0
    explained = capsys.readouterr().out
    assert "cpu fp32" in explained and "decision:" in explained


def test_explain_registers_and_recalibrates_a_kind_given_by_reference(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_SEARCH", "precision")
    monkeypatch.setenv("AUTOTUNE_ISOLATION", "inprocess")  # the worker path is the test above
    assert main(["--explain", "mine=families_for_tests:build_tiny", "--recalibrate", "--json"]) == 0
    measured = cached_families(["mine"])["mine"]
    config = autotune.Config.model_validate(json.loads(capsys.readouterr().out))  # the Evidence --explain promises
    assert config.model_kind == "mine" and config.source == "measured" and config.evidence is not None
    assert {rival.candidate.label for rival in config.evidence.rivals} < {row.candidate.label for row in
                                                                          measured.candidates}
    assert autotune.get_family("mine").ref == "families_for_tests:build_tiny"


def test_an_unknown_kind_says_how_to_name_your_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trace", "mine"]) == 1
    err = capsys.readouterr().err
    assert "unknown model kind 'mine'" in err and "--family NAME=package.module:function" in err


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--family", "mine=no_such_module_xyz:build"], "cannot import", id="missing-module"),
    pytest.param(["--explain", "mine=families_for_tests"], "form 'package.module:function'", id="no-function"),
    pytest.param(["--trace", "../x=families_for_tests:build_tiny"], "names are 1-64 letters", id="bad-name"),
])
def test_bad_references_fail_before_anything_is_measured(argv: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err
    assert cached_families() == {}


@pytest.mark.parametrize("argv", [["--out", "x"], ["--candidate", "cpu fp32"]])
def test_trace_options_without_trace_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
