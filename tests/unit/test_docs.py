"""The documentation in docs/ (and the README) against the code: every public name has its reference, every call and
signature the pages show binds to the code as written, every command line parses, every option, environment
variable, error and Config field is on its page, and no page outgrows a sitting. ``mkdocs build --strict`` (CI)
checks the links and renders the reference from the docstrings."""

from __future__ import annotations

import ast
import inspect
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

import autotune
from autotune import _args, _env, _errors

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
#: the names the pages give the objects they call methods on
RECEIVERS: dict[str, object] = {"autotune": autotune, "cfg": autotune.Config, "guard": autotune.Guard,
                                "job": autotune.CalibrationJob}
#: the most lines a page may have: one sitting's reading
PAGE_LINES = 300


def _text(page: Path) -> str:
    """The page as the site shows it: pymdownx.snippets' ``--8<-- "path"`` lines replaced by the file."""
    return re.sub(r'^--8<-- "([^"]+)"$', lambda m: (ROOT / m.group(1)).read_text().rstrip("\n"), page.read_text(),
                  flags=re.MULTILINE)


def _shown() -> Iterator[tuple[str, str]]:
    for page in [*PAGES, ROOT / "README.md"]:
        yield str(page.relative_to(ROOT)), _text(page)


def _target(receiver: str, name: str) -> inspect.Signature | None:
    """The signature a call ``receiver.name(...)`` binds to (a method's without ``self``); None for what is not
    callable (``cfg.device``)."""
    owner = RECEIVERS[receiver]
    found = getattr(owner, name)
    if not callable(found):
        return None
    signature = inspect.signature(found)
    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, name)):
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


def _calls(tree: ast.AST) -> Iterator[tuple[str, str, ast.Call]]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in RECEIVERS):
            yield node.func.value.id, node.func.attr, node


def _binds(signature: inspect.Signature, call: ast.Call) -> str | None:
    """Why the call cannot bind (None when it does). ``f(...)`` elides the arguments; a ``*args`` or ``**kwargs``
    in the call binds what the names around it say."""
    elided = call.args[0] if len(call.args) == 1 and not call.keywords else None
    if isinstance(elided, ast.Constant) and elided.value is Ellipsis:
        return None
    positional = [None for a in call.args if not isinstance(a, ast.Starred)]
    keywords = {k.arg: None for k in call.keywords if k.arg is not None}
    bind = signature.bind_partial if len(positional) < len(call.args) or len(keywords) < len(call.keywords) else \
        signature.bind
    try:
        bind(*positional, **keywords)
    except TypeError as exc:
        return str(exc)
    return None


def _parameters(shown: str) -> list[tuple[str, str, object]]:
    """``f(a, *, b=None)`` as (name, kind, default) triples."""
    function = ast.parse(f"def {shown}: pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    arguments = function.args
    plain = arguments.posonlyargs + arguments.args
    defaults = [inspect.Parameter.empty] * (len(plain) - len(arguments.defaults)) + [
        ast.literal_eval(d) for d in arguments.defaults]
    found = [(a.arg, "positional", d) for a, d in zip(plain, defaults, strict=True)]
    if arguments.vararg:
        found.append((arguments.vararg.arg, "*", inspect.Parameter.empty))
    found += [(a.arg, "keyword", inspect.Parameter.empty if d is None else ast.literal_eval(d))
              for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]
    if arguments.kwarg:
        found.append((arguments.kwarg.arg, "**", inspect.Parameter.empty))
    return found


def _actual(signature: inspect.Signature) -> list[tuple[str, str, object]]:
    words = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.KEYWORD_ONLY: "keyword",
             inspect.Parameter.VAR_KEYWORD: "**"}
    return [(p.name, words[p.kind], p.default) for p in signature.parameters.values()]


def _signature_differs(span: str) -> str | None:
    """Why ``span``, read as a signature, is not the code's; None where it is, or where it is no signature."""
    receiver, _, rest = span.partition(".")
    name = rest.partition("(")[0]
    try:
        shown = _parameters(rest)
    except (SyntaxError, ValueError):  # a call: `autotune.get_family(name).build()`
        return None
    signature = _target(receiver, name)
    if signature is None or shown != _actual(signature):
        return f"the code's is {name}{signature}"
    return None


def _call_fails(span: str) -> str | None:
    """Why ``span``, read as a call, does not bind; a signature that only parses as one is compared as one."""
    try:
        expression = ast.parse(span, mode="eval")
    except SyntaxError:  # only a signature parses: `cfg.guard(model=None, optimizer=None, *, loss_fn=None)`
        return _signature_differs(span)
    for receiver, name, call in _calls(expression):
        signature = _target(receiver, name)
        why = _binds(signature, call) if signature is not None else f"{name} is not callable"
        if why is not None:
            return why
    return None


def _mismatches() -> list[str]:
    wrong = []
    for where, text in _shown():
        for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
            for receiver, name, call in _calls(ast.parse(block)):
                signature = _target(receiver, name)
                why = _binds(signature, call) if signature is not None else f"{name} is not callable"
                if why is not None:
                    wrong.append(f"{where}: {ast.unparse(call)}: {why}")
        for line in text.splitlines():
            # A table's first cell names calls by their signatures (`autotune.trace(model_kind, *, ...)`); elsewhere
            # a span is a call unless only a signature parses (`cfg.guard(model=None, ..., *, loss_fn=None)`).
            first_cell = line.split("|")[1] if line.startswith("| `") else ""
            for span in re.findall(r"`((?:autotune|cfg|guard|job)\.\w+\(.*?\))`", line):
                why = _signature_differs(span) if span in first_cell else None
                if why is None:
                    why = _call_fails(span)
                if why is not None:
                    wrong.append(f"{where}: {span}: {why}")
    return wrong


def test_every_public_name_has_its_reference() -> None:
    reference = "".join(page.read_text() for page in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: autotune\.(\w+)$", reference, re.MULTILINE))
    assert set(autotune.__all__) - {"__version__"} <= documented, set(autotune.__all__) - documented
    assert documented <= set(autotune.__all__)
    assert "autotune.__version__" in reference and "autotune.GuardCallback" in reference


def test_every_call_and_signature_the_pages_show_binds_to_the_code() -> None:
    assert _mismatches() == []


def test_a_renamed_parameter_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails when the code renames a parameter the pages use: ``batch_size`` of dataloader_kwargs,
    shown as a keyword, and ``version`` of register_family, shown in a signature."""

    def dataloader_kwargs(self: object, dataset: object, *, batch: int, key: str | None = None,
                          **fixed: object) -> dict[str, object]:
        return {}

    def register_family(name: str, build: object, *, description: str = "", revision: str | None = None) -> None:
        return None

    monkeypatch.setattr(autotune.Config, "dataloader_kwargs", dataloader_kwargs)
    monkeypatch.setattr(autotune, "register_family", register_family)
    wrong = _mismatches()
    assert any("dataloader_kwargs" in line and "batch_size" in line for line in wrong), wrong
    assert any("register_family(name, build, *, description" in line for line in wrong), wrong


def _commands(text: str) -> Iterator[str]:
    for block in re.findall(r"```(?:bash|text)\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            command = re.search(r"(?:^|\$ |&& )python -m autotune(?=\s|$)(.*)", line)
            if command is not None:
                yield command.group(1).split(" && ")[0]


def test_every_command_line_the_pages_show_parses() -> None:
    parser = _args.parser(autotune.__version__)
    shown = [(where, command) for where, text in _shown() for command in _commands(text)]
    assert len(shown) > 20
    for where, command in shown:
        try:
            parser.parse_args(shlex.split(command, comments=True))
        except SystemExit:
            pytest.fail(f"{where}: python -m autotune{command} does not parse")


def test_every_option_of_the_command_line_is_in_its_reference() -> None:
    rows = [line for line in (DOCS / "reference" / "cli.md").read_text().splitlines() if line.startswith("| `")]
    options = {option for action in _args.parser(autotune.__version__)._actions for option in action.option_strings}
    missing = {option for option in options if not any(re.search(rf"`{re.escape(option)}\b", row) for row in rows)}
    assert missing == set()


def test_every_environment_variable_is_in_its_reference_and_the_commands_help() -> None:
    rows = set(re.findall(r"^\| `(AUTOTUNE_[A-Z_]+)` \|", (DOCS / "reference" / "environment.md").read_text(),
                          re.MULTILINE))
    helped = set(re.findall(r"AUTOTUNE_[A-Z_]+", _args.EPILOG.split("environment:")[1]))
    assert {knob.name for knob in _env.KNOBS} == rows == helped


def test_every_error_has_its_reference_and_what_to_do() -> None:
    errors = {name for name, value in vars(_errors).items()
              if inspect.isclass(value) and issubclass(value, _errors.AutotuneError)}
    assert errors <= set(autotune.__all__)
    troubleshooting = set(re.findall(r"^## (\w+)$", (DOCS / "troubleshooting.md").read_text(), re.MULTILINE))
    reference = set(re.findall(r"^::: autotune\.(\w+)$", (DOCS / "reference" / "errors.md").read_text(), re.MULTILINE))
    assert errors <= troubleshooting and errors == reference


def test_the_config_table_lists_every_field_and_property() -> None:
    first_cells = [line.split("|")[1] for line in (DOCS / "reference" / "config.md").read_text().splitlines()
                   if line.startswith("| `")]
    shown = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    fields = set(autotune.Config.model_fields)
    properties = {name for name, value in inspect.getmembers(autotune.Config)
                  if isinstance(value, property) and not name.startswith(("_", "model_"))}
    assert fields | properties <= shown, (fields | properties) - shown


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(DOCS)) for page in PAGES])
def test_a_page_is_read_in_one_sitting(page: Path) -> None:
    assert len(page.read_text().splitlines()) <= PAGE_LINES
