"""The flow generator -> world -> history -> judge -> report, read from the imports: every
package of `harness` sits on one layer, and imports only from layers below its own; and the
judge reaches no code under test through any chain of imports."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from test_import_graph import import_graph, write_package

HARNESS = Path(__file__).resolve().parents[1] / "harness"

# Lowest first. A top-level module counts as a package of its own.
LAYERS = (
    "errors", "data_file", "termination",  # one-line errors, TOML/JSON input, SIGTERM
    "vllm_code",  # vLLM's source as data: diffs, patch descriptors, which vLLM a tree is
    "bug_switches", "config_values", "config_parts", "config",  # plain data and rules
    "timeouts", "batch", "faults", "invariants",  # invariants: the checkers by name
    "dead_ranks",  # which DP ranks died, and who was told, across a scenario's steps
    "runtime",  # collectives, streams, graphs, the microbatch thread ring
    "model",  # the miniature MoE and its single-process reference
    "scenario",  # one replayable case
    "history",  # what the ranks decided and did
    "spec",  # docs/spec.md's decision restated: what gen aims with and check judges by
    "sut",  # the rank code: decisions, capture, dispatch, replay
    "vllm_sut",  # vLLM's decision code in the rank's slots
    "vllm_exec",  # vLLM's execution code running the rank's steps
    "gen",  # Hypothesis strategies: they know nothing of worlds
    "world",  # where ranks live (the single-rank GPU world too); hands back history
    "check",  # the judge: checkers over history, nothing of processes nor of the rank code
    "reference_plans",  # what another system is held to, made by the harness's decision code
    "exhaustive",  # every decode vector of a small world through the decision code
    "cli_schedule", "cli_config", "cli_vllm", "fuzz", "report", "bench",
    "cli_result", "cli_check",  # the verdicts as `run` prints them; a saved run judged again
    "cli",
    "campaign",  # fuzz jobs sharing a database, a local Redis server, the merged report
    "__main__",
)


def package_of(path: Path, root: Path = HARNESS) -> str:
    return path.relative_to(root).with_suffix("").parts[0]


def imported_packages(path: Path) -> set[str]:
    """Every harness package a module imports, at any depth (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from harness import bench` imports the package bench
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "harness" and len(parts) > 1:
                found.add(parts[1])
    return found


def package_edges(root: Path = HARNESS) -> set[tuple[str, str, str]]:
    """(importing package, imported package, file) for imports that cross packages."""
    edges = set()
    for path in sorted(root.rglob("*.py")):
        if path == root / "__init__.py":
            continue
        src = package_of(path, root)
        for dst in imported_packages(path):
            if dst != src:
                edges.add((src, dst, str(path.relative_to(root))))
    return edges


def upward_imports(edges: Iterable[tuple[str, str, str]],
                   layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Every import of a package from its own layer or one above, and of an unplaced one."""
    rank = {name: i for i, name in enumerate(layers)}
    problems = []
    for src, dst, where in sorted(edges):
        if src not in rank or dst not in rank:
            unplaced = src if src not in rank else dst
            problems.append(f"{where}: package {unplaced!r} has no layer in LAYERS")
        elif rank[dst] >= rank[src]:
            problems.append(f"{where}: {src} (layer {rank[src]}) imports {dst} "
                            f"(layer {rank[dst]})")
    return problems


def cycles(edges: Iterable[tuple[str, str, str]]) -> list[list[str]]:
    """Package cycles, each as the path that closes it."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        graph.setdefault(src, set()).add(dst)
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_package_imports_only_from_the_layers_below_it():
    assert upward_imports(package_edges()) == []


def test_no_two_packages_import_each_other_through_any_path():
    assert cycles(package_edges()) == []


def test_every_package_of_the_harness_has_a_layer():
    packages = {package_of(p) for p in HARNESS.rglob("*.py") if p != HARNESS / "__init__.py"}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def test_a_world_that_judged_or_a_checker_that_ran_a_world_would_be_refused():
    edges = package_edges() | {("world", "check", "world/sim.py"),
                               ("check", "world", "check/judge.py")}
    problems = upward_imports(edges)
    world, check = LAYERS.index("world"), LAYERS.index("check")
    assert problems == [f"world/sim.py: world (layer {world}) imports check (layer {check})"]
    assert ["check", "world", "check"] in cycles(edges)


def test_a_new_package_without_a_layer_is_refused(tmp_path):
    (tmp_path / "newpkg").mkdir()
    (tmp_path / "newpkg" / "thing.py").write_text("from harness.sut import systems\n")
    (tmp_path / "sut").mkdir()
    (tmp_path / "sut" / "systems.py").write_text("import harness.newpkg.thing\n")
    edges = package_edges(tmp_path)
    assert upward_imports(edges) == [
        "newpkg/thing.py: package 'newpkg' has no layer in LAYERS",
        "sut/systems.py: package 'newpkg' has no layer in LAYERS"]
    assert cycles(edges) == [["newpkg", "sut", "newpkg"]]


# The judge holds a run to an oracle with no bug in it: no module of check reaches, through
# any chain of imports, the rank code a world runs (it sits below check in LAYERS).
UNDER_TEST = ("sut", "vllm_sut", "vllm_exec")


def judge_reaches_code_under_test(root: Path = HARNESS) -> list[str]:
    """One import chain 'check module -> ... -> module under test' per module under test that
    a module of check reaches."""
    graph = import_graph(root)
    came_from = {m: "" for m in graph if _package(m) == "check"}
    todo = sorted(came_from)
    while todo:  # breadth first: each chain found is a shortest one
        module = todo.pop(0)
        for nxt in sorted(graph.get(module, ())):
            if nxt not in came_from:
                came_from[nxt] = module
                todo.append(nxt)
    chains = []
    for module in sorted(m for m in came_from if _package(m) in UNDER_TEST):
        chain = [module]
        while came_from[chain[-1]]:
            chain.append(came_from[chain[-1]])
        chains.append(" -> ".join(reversed(chain)))
    return chains


def _package(module: str) -> str:
    """The package of `harness` (or of a test's stand-in) a dotted module name sits in."""
    return module.split(".")[1] if "." in module else ""


def test_the_judge_imports_nothing_of_the_code_under_test_through_any_chain():
    assert judge_reaches_code_under_test() == []


def test_a_checker_reaching_the_rank_code_through_another_module_is_refused(tmp_path):
    package = write_package(tmp_path, {
        "check/__init__.py": "",
        "check/judge.py": "from pkg.gen import aim\n",  # gen sits below check in LAYERS
        "check/clean.py": "from pkg.spec import decision\n",
        "gen/__init__.py": "",
        "gen/aim.py": "def plans():\n    from pkg.sut.step_plan import plan\n",
        "spec/__init__.py": "",
        "spec/decision.py": "",
        "sut/__init__.py": "",
        "sut/step_plan.py": "",
        "vllm_exec/__init__.py": "",
        "vllm_exec/runner.py": "import pkg.check.clean\n",  # the other way is allowed
    })
    assert judge_reaches_code_under_test(package) == [
        "pkg.check.judge -> pkg.gen.aim -> pkg.sut",
        "pkg.check.judge -> pkg.gen.aim -> pkg.sut.step_plan"]
