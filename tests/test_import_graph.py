"""No module of `harness` imports, directly or through other modules, a module that imports it
back. The graph is read from the source with `ast`: every import of a file counts, lazy ones
inside functions and those under TYPE_CHECKING included, since each is a circle in waiting."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _base_of(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The package a (possibly relative) `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _module_of(name: str, files: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is a module of the package, if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in files:
            return ".".join(parts[:end])
    return None


def imported_modules(module: str, files: dict[str, Path]) -> set[str]:
    """The modules of the package that one module's file imports, anywhere in it."""
    path = files[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_module_of(alias.name, files) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(module, path, node)
            for alias in node.names:
                # `from p import x`: the submodule p.x when there is one, else p's own file
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in files else _module_of(base, files))
    found.discard(None)
    # Importing p.q.m runs p and p.q first; my own packages are already running.
    found |= {ancestor for target in found for ancestor in _packages_above(target)
              if ancestor in files and ancestor not in _packages_above(module)}
    found.discard(module)
    return found


def _packages_above(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts))}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    files = module_files(root)
    return {module: imported_modules(module, files) for module in files}


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every set of modules that reach each other through imports (the strongly connected
    components of more than one module, or of one that imports itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:  # Tarjan; depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(circle: tuple[str, ...], graph: dict[str, set[str]]) -> str:
    """One line per circle: its modules, and who imports whom inside it."""
    inside = set(circle)
    edges = [f"{a} -> {b}" for a in circle for b in sorted(graph[a] & inside)]
    return f"{' <-> '.join(circle)} ({'; '.join(edges)})"


def test_no_module_of_the_harness_imports_a_module_that_imports_it_back():
    graph = import_graph(HARNESS)
    found = [describe(c, graph) for c in circles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under `root` from {relative path: source}; returns its directory."""
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


def test_a_two_file_and_a_three_file_circle_are_both_named(tmp_path):
    package = write_package(tmp_path, {
        "a.py": "from pkg import b\n",  # a submodule by `from package import`
        "b.py": "def f():\n    from .a import thing\n",  # lazy and relative
        "c.py": "import pkg.a\n",  # imports into a circle, is not in one
        "sub/__init__.py": "",
        "sub/x.py": "import pkg.sub.y\n",
        "sub/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from pkg.sub.z import Z\n",
        "sub/z.py": "from ..sub import x\n",
    })
    assert circles(import_graph(package)) == [
        ("pkg.a", "pkg.b"), ("pkg.sub.x", "pkg.sub.y", "pkg.sub.z")]


def test_a_circle_closed_by_running_a_package_init_is_named(tmp_path):
    # pkg.q.y imports a submodule of pkg.p, which runs pkg.p's __init__ first.
    package = write_package(tmp_path, {
        "p/__init__.py": "from pkg.p.x import X\n",
        "p/x.py": "from pkg.q.y import Y\n",
        "p/w.py": "W = 1\n",
        "q/__init__.py": "",
        "q/y.py": "from pkg.p.w import W\n",
    })
    graph = import_graph(package)
    assert circles(graph) == [("pkg.p", "pkg.p.x", "pkg.q.y")]
    assert describe(circles(graph)[0], graph) == (
        "pkg.p <-> pkg.p.x <-> pkg.q.y (pkg.p -> pkg.p.x; pkg.p.x -> pkg.q.y; pkg.q.y -> pkg.p)")


def test_imports_that_only_go_one_way_make_no_circle(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "from pkg.a import A\n",  # an init re-exporting its own module
        "a.py": "from pkg.b import B\nimport pkg.c\nA = 1\n",
        "b.py": "from . import c\nfrom .d import D\nB = 2\n",
        "c.py": "import os\nfrom pkg.d import D\n",
        "d.py": "from pkg import e\nD = 3\n",
        "e.py": "",
    })
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b", "pkg.c"}
    assert graph["pkg.b"] == {"pkg.c", "pkg.d"}
    assert graph["pkg.d"] == {"pkg.e"}
    assert circles(graph) == []
