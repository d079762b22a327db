"""The README's first example is the reader's own model, and it runs as written: its two files become a package,
calibration measures the family it registers (in this process, on a small budget), and the loop trains under the
guard."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

import autotune
from autotune._tools import loader as loader_tuner

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_the_first_example_is_the_readers_own_model_before_any_built_in() -> None:
    models, train = _blocks()[:2]
    assert models.startswith("# my_app/models.py") and "def build(" in models and "autotune.Workload(" in models
    assert train.startswith("# my_app/train.py") and 'autotune.register_family("classifier", build)' in train
    text = README.read_text()
    assert text.index("my_app/models.py") < text.index('best_config("cnn")')


@pytest.mark.usefixtures("in_process")
def test_the_first_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models, train = _blocks()[:2]
    package = tmp_path / "my_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(models)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(loader_tuner, "BUDGET_S", 1.0)  # the DataLoader's measurement, as its own tests budget it
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(192, 3, 32, 32), torch.randint(0, 10, (192,)))
    namespace = {"__name__": "__main__", "dataset": dataset}
    exec(compile(train, str(package / "train.py"), "exec"), namespace)
    cfg, guard = namespace["cfg"], namespace["guard"]
    assert isinstance(cfg, autotune.Config) and cfg.source == "measured" and cfg.model_kind == "classifier"
    assert isinstance(guard, autotune.Guard) and guard.steps == 3 and guard.finding is None
    assert guard.summary().batches == 3


def test_ci_runs_the_readmes_test_command() -> None:
    command = next(line for line in README.read_text().splitlines() if line.startswith("pip install torch==2.13.0 && "))
    steps = command.split(" && ")
    assert steps[-1] == "python -m pytest -q"
    # .ci/run: every step, in order (pip quietly)
    ci = [re.sub(r"^pip install -q ", "pip install ", line) for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert all(step in ci for step in steps), [step for step in steps if step not in ci]
    at = [ci.index(step) for step in steps]
    assert at == sorted(at)
    # the hosted workflow: every step after the installs (its torch comes from the matrix)
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert all(re.search(rf"^ +(- )?(run: )?{re.escape(step)}$", workflow, re.MULTILINE) for step in steps[2:])


def test_every_environment_variable_is_in_the_readmes_table_and_the_commands_help() -> None:
    from autotune import _args, _env

    rows = set(re.findall(r"^\| `(AUTOTUNE_[A-Z_]+)` \|", README.read_text(), re.MULTILINE))
    helped = set(re.findall(r"AUTOTUNE_[A-Z_]+", _args.EPILOG.split("environment:")[1]))
    assert {knob.name for knob in _env.KNOBS} == rows == helped
