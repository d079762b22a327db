"""The package's layout as a rule: imports run one way, with no circle and no climb back to the package root.

Read from the source: every import, function-local ones and those for type checking only included (a type a module
names is a room it depends on)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "autotune"

#: room -> all it imports of autotune: the variant table, the errors, the statistics and the walk of a batch import
#: nothing of it; the records, only the variant table (a Choice's fields are its rows); where a launcher put a
#: process, only the errors; the job's group, no Config (the guard and the Config use it)
ONLY = {
    "autotune._variants": set(),
    "autotune._batch": set(),
    "autotune._errors": set(),
    "autotune._stats": set(),
    "autotune._records": {"autotune._variants"},
    "autotune._ranks.launch": {"autotune._errors"},
    "autotune._ranks.group": {"autotune._env", "autotune._errors", "autotune._ranks.launch", "autotune._records",
                              "autotune._version"},
}
#: room -> the rooms it never imports: the worker's package prunes and never decides or touches the cache; the cache
#: times nothing and knows no Config; the decision is pure; the host side of the worker process holds no results; the
#: ranks of a job exchange answers and never measure (the one way to an answer hands them what to exchange)
NEVER = {
    "autotune._ranks": {"autotune._answer", "autotune._calibrate", "autotune._cache", "autotune._lab",
                        "autotune._worker", "autotune._background", "autotune._tools"},
    "autotune.backends": {"autotune._cache", "autotune._lab", "autotune._worker", "autotune._config",
                          "autotune._decide", "autotune._answer", "autotune._calibrate"},
    "autotune._lab": {"autotune._answer", "autotune._cache", "autotune._decide", "autotune._config",
                      "autotune._guard", "autotune._calibrate", "autotune._background", "autotune._worker",
                      "autotune._tools"},
    "autotune._cache": {"autotune._answer", "autotune._config", "autotune._decide", "autotune._guard",
                        "autotune._lab", "autotune._calibrate", "autotune._background", "autotune._worker",
                        "autotune._tools"},
    "autotune._decide": {"autotune._cache", "autotune._lab", "autotune._worker", "autotune._calibrate",
                         "autotune._answer", "autotune.backends"},
    "autotune._worker": {"autotune._answer", "autotune._decide", "autotune._config", "autotune._calibrate",
                         "autotune._cache.store", "autotune._cache.lookup"},
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

#: the arrows of the one circle of rooms left (a room: a top-level module or a package): the torch-side application
#: of the variants (``_variants.apply``) lives in the variant table's package, which the records read
ROOM_CIRCLE_ARROWS = {("autotune._records", "autotune._variants"), ("autotune._variants", "autotune._records"),
                      ("autotune._variants", "autotune.backends"), ("autotune.backends", "autotune._records")}


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


def test_rooms_climb_back_up_only_where_known() -> None:
    # Between rooms an arrow inside a circle climbs back up; the ones left are named above, and none may be added.
    rooms: dict[str, set[str]] = {}
    for name, imported in GRAPH.items():
        rooms.setdefault(_room(name), set()).update(_room(i) for i in imported if _room(i) != _room(name))
    inside = {(a, b) for circle in _circles(rooms) for a in circle for b in rooms[a] if b in circle}
    assert inside <= ROOM_CIRCLE_ARROWS


def test_one_module_decides() -> None:
    # An answer is the decision less what training demoted (``_answer.decided``): deciding elsewhere forgets that.
    calls = {name for name, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "decide"}
    assert calls == {"autotune._answer"}


@pytest.mark.parametrize("room", sorted(ONLY))
def test_the_lowest_rooms_import_only_what_they_name(room: str) -> None:
    assert GRAPH[room] - {"autotune"} <= ONLY[room]


@pytest.mark.parametrize("room", sorted(NEVER))
def test_imports_run_one_way(room: str) -> None:
    wrong = {
        (name, imported)
        for name, imports in GRAPH.items() if name == room or name.startswith(room + ".")
        for imported in imports
        for banned in NEVER[room]
        if (imported == banned or imported.startswith(banned if banned.endswith(".") else banned + "."))
        and not (imported == room or imported.startswith(room + "."))
    }
    assert sorted(wrong) == []


def test_the_command_line_parses_its_arguments_before_it_imports_anything_heavy() -> None:
    assert GRAPH["autotune._args"] == set()
