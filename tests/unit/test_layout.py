"""The package's layout as a rule: imports run one way, with no circle and no climb back to the package root.

Read from the source: every import, function-local ones and those for type checking only included (a type a module
names is a room it depends on)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "autotune"

#: room -> all it imports of autotune: the variant table, the errors, the statistics and the walk of a batch import
#: nothing of it; the records, only the variant table (a Choice's fields are its
#: rows); the loop's and the tools' reports, only the records; where a launcher put a process, only the errors; the
#: job's group, no Config (the guard and the Config use it); what a precision means to torch, only the table
ONLY = {
    "autotune._variants": set(),
    "autotune._batch": set(),
    "autotune._errors": set(),
    "autotune._stats": set(),
    "autotune._records": {"autotune._variants"},
    "autotune._reports": {"autotune._records"},
    "autotune._ranks.launch": {"autotune._errors"},
    "autotune._ranks.group": {"autotune._env", "autotune._errors", "autotune._ranks.launch", "autotune._records",
                              "autotune._version"},
    "autotune._apply.precision": {"autotune._variants"},
    "autotune._apply.fp32": {"autotune._variants", "autotune._records"},
}
#: room -> the rooms it never imports: the worker's child prunes and never decides or touches the cache, nor reaches
#: its host side; the cache times nothing and knows no Config; the decision is pure; the host side of the worker
#: process holds no results; the ranks of a job exchange answers and never measure (the one way to an answer hands
#: them what to exchange); the torch-side application serves the worker, the guard and the Config, and reads none of
#: them; the framework adapters take a decision and never answer one (the Config loads them, not the other way).
#: A sub-room's own row replaces its room's.
NEVER = {
    "autotune._ranks": {"autotune._answer", "autotune._calibrate", "autotune._cache", "autotune._lab",
                        "autotune._background", "autotune._tools", "autotune._apply", "autotune._frameworks"},
    "autotune.backends": {"autotune._cache", "autotune._lab", "autotune._config", "autotune._decide",
                          "autotune._answer", "autotune._calibrate", "autotune._apply", "autotune._frameworks"},
    "autotune._apply": {"autotune._lab", "autotune._cache", "autotune._decide", "autotune._answer", "autotune._config",
                        "autotune._guard", "autotune._calibrate", "autotune._tools", "autotune._ranks",
                        "autotune._frameworks"},
    "autotune._frameworks": {"autotune._config", "autotune._answer", "autotune._calibrate", "autotune._background",
                             "autotune._decide", "autotune._lab", "autotune._tools", "autotune._cache"},
    "autotune._lab": {"autotune._answer", "autotune._cache", "autotune._decide", "autotune._config",
                      "autotune._guard", "autotune._calibrate", "autotune._background", "autotune._tools",
                      "autotune._frameworks", "autotune._lab.host"},
    "autotune._lab.host": {"autotune._answer", "autotune._decide", "autotune._config", "autotune._calibrate",
                           "autotune._cache.store", "autotune._cache.lookup", "autotune._tools"},
    "autotune._cache": {"autotune._answer", "autotune._config", "autotune._decide", "autotune._guard",
                        "autotune._lab", "autotune._calibrate", "autotune._background", "autotune._tools"},
    "autotune._decide": {"autotune._cache", "autotune._lab", "autotune._calibrate", "autotune._answer",
                         "autotune.backends"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The autotune modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "autotune")

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            module = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{module}" if module else base
            if module.split(".")[0] != "autotune":
                return
            for alias in node.names:  # ``from autotune import _env`` imports the submodule, not the root's names
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)

    Visitor().visit(ast.parse(path.read_text()))
    return found - {name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _runtime_imports(path: Path) -> set[str]:
    """The top-level packages a module imports when it runs: those under ``if TYPE_CHECKING:`` left out."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found

def _room(name: str) -> str:
    return ".".join(name.split(".")[:2])


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, set()) - {"autotune"}:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_module_imports_the_package_root() -> None:
    # The root re-exports the public names lazily; a module that climbs back to it depends on everything.
    assert [name for name, imported in GRAPH.items() if "autotune" in imported and name != "autotune"] == []


def test_imports_have_no_circle() -> None:
    assert _circles(GRAPH) == []


def test_rooms_have_no_circle() -> None:
    # Between rooms (a top-level module or a package) an arrow inside a circle climbs back up; without a circle the
    # rooms have an order, and every arrow runs down it.
    rooms: dict[str, set[str]] = {}
    for name, imported in GRAPH.items():
        rooms.setdefault(_room(name), set()).update(_room(i) for i in imported if _room(i) != _room(name))
    assert _circles(rooms) == []


def test_one_module_decides() -> None:
    # An answer is the decision less what training demoted (``_answer.decided``): deciding elsewhere forgets that.
    calls = {name for name, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "decide"}
    assert calls == {"autotune._answer"}


@pytest.mark.parametrize("room", sorted(ONLY))
def test_the_lowest_rooms_import_only_what_they_name(room: str) -> None:
    assert GRAPH[room] - {"autotune"} <= ONLY[room]


def _in(room: str, name: str) -> bool:
    return name == room or name.startswith(room + ".")


def _row(name: str) -> str | None:
    """The most specific NEVER row over ``name``: a sub-room's own row replaces its room's."""
    return max((room for room in NEVER if _in(room, name)), key=len, default=None)


@pytest.mark.parametrize("room", sorted(NEVER))
def test_imports_run_one_way(room: str) -> None:
    wrong = {
        (name, imported)
        for name, imports in GRAPH.items() if _row(name) == room
        for imported in imports
        for banned in NEVER[room]
        if _in(banned, imported) and not (_in(room, imported) and not _in(room, banned))
    }
    assert sorted(wrong) == []


def test_the_command_line_parses_its_arguments_before_it_imports_anything_heavy() -> None:
    # Its one import of autotune, the candidate's table (the --prefer words), runs only the standard library.
    assert GRAPH["autotune._args"] <= {"autotune._variants"}
    assert _runtime_imports(MODULES["autotune._variants"]) <= set(sys.stdlib_module_names) | {"__future__"}


#: the most lines a module may have: past it, a module holds more than one room
MODULE_LINES = 500
#: the most lines a docstring may have: the rest belongs in the docs' pages
DOCSTRING_LINES = 20


def test_no_module_is_over_500_lines() -> None:
    sizes = {str(path.relative_to(PACKAGE.parent)): len(path.read_text().splitlines()) for path in MODULES.values()}
    over = {name: lines for name, lines in sizes.items() if lines > MODULE_LINES}
    assert over == {}


def test_no_docstring_is_over_20_lines() -> None:
    long = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node)
                if docstring is not None and len(docstring.splitlines()) > DOCSTRING_LINES:
                    long[f"{name}.{getattr(node, 'name', '')}".rstrip(".")] = len(docstring.splitlines())
    assert long == {}


#: module-level values that are state of a process, not constants: containers and what waits or locks
_STORES = ("dict", "list", "set", "deque", "defaultdict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary",
           "WeakSet", "Event", "Lock", "RLock")
#: modules whose module-level values are not the process's memory of earlier calls: the flag of a process serving as
#: a calibration worker, and the PyInstaller hook's declarations (read by PyInstaller, never imported)
NOT_MEMORY = {"autotune._lab.entry", "autotune._pyinstaller.hook-autotune"}


def _stores(path: Path) -> list[str]:
    """The module-level names of ``path`` that hold state between calls (a memo of a pure function is no state)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = node.value
            called = ast.unparse(value.func).rsplit(".", 1)[-1] if isinstance(value, ast.Call) else None
            if isinstance(target, ast.Name) and not target.id.isupper() and target.id != "__all__" and (
                    isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
                    or called in _STORES):
                found.append(target.id)
    return found


def test_every_module_with_process_memory_is_reset_by_reset_state_through_its_own_public_function() -> None:
    from autotune import testing

    tree = ast.parse(Path(testing.__file__).read_text())
    aliases = {alias.asname or alias.name: f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
               else node.module
               for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    (reset_state,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "reset_state"]
    called: dict[str, set[str]] = {}
    for node in ast.walk(reset_state):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
                called.setdefault(aliases[function.value.id], set()).add(function.attr)
            elif isinstance(function, ast.Name):
                called.setdefault(aliases[function.id], set()).add(function.id)
    with_memory = {name for name, path in MODULES.items() if _stores(path)} - NOT_MEMORY
    assert sorted(with_memory - set(called)) == [], "a module keeps state that reset_state does not reset"
    assert {name: sorted(n for n in names if n.startswith("_")) for name, names in called.items()
            if any(n.startswith("_") for n in names)} == {}, "reset_state reaches into private names"
