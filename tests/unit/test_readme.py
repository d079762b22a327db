"""The README is read in five minutes: short, its example is the reader's own model as the files in examples/ hold it
(tests/process/test_examples.py runs them), its test command is what CI runs, and its links lead somewhere. What the
README used to hold is in docs/, checked against the code by tests/unit/test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
#: at most, for five minutes of reading (the anchors' READMEs are 4-18 KB)
README_LINES, README_BYTES = 200, 15_000
#: the tiers that start no process run first, so that a failure there stops the run before the slow ones
FAST_TIERS = "python -m pytest -q tests/unit tests/sim"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len(README.read_text().splitlines()) <= README_LINES
    assert len(README.read_bytes()) <= README_BYTES


def test_the_readme_shows_the_readers_own_model_as_the_examples_hold_it() -> None:
    blocks = _blocks()
    models = next(block for block in blocks if block.startswith("# my_app/models.py"))
    train = next(block for block in blocks if block.startswith("# train.py"))
    assert models == (EXAMPLES / "my_app" / "models.py").read_text()
    assert train == (EXAMPLES / "train.py").read_text()
    assert "def build(" in models and "autotune.Workload(" in models
    assert 'autotune.register_family("classifier", build)' in train


def test_ci_runs_the_readmes_test_command() -> None:
    command = next(line for line in README.read_text().splitlines() if line.startswith("pip install torch==2.13.0 && "))
    steps = command.split(" && ")
    assert steps[-2:] == [FAST_TIERS, "python -m pytest -q --ignore=tests/unit --ignore=tests/sim"]
    # .ci/run: every step, in order (pip quietly)
    ci = [re.sub(r"^pip install -q ", "pip install ", line) for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert all(step in ci for step in steps), [step for step in steps if step not in ci]
    at = [ci.index(step) for step in steps]
    assert at == sorted(at)
    # the hosted workflow: every step after the installs (its torch comes from the matrix)
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert all(re.search(rf"^ +(- )?(run: )?{re.escape(step)}$", workflow, re.MULTILINE) for step in steps[2:])


def test_ci_builds_the_documentation_strictly_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    build = next(i for i, line in enumerate(ci) if re.search(r"\bmkdocs build --strict\b", line))
    assert build < ci.index(FAST_TIERS)
    assert any(re.fullmatch(r"pip install -q -e '\.\[(\w+,)*docs(,\w+)*\]'", line) for line in ci[:build])


def test_the_readmes_links_lead_to_files() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text())
    assert links and [link for link in links if not (ROOT / link).exists()] == []
