"""The harness uses Hypothesis through its public API only: no `_hypothesis_internal`
attribute, and imports from Hypothesis's documented modules alone, so that an upgrade of
Hypothesis cannot silently change how the fuzzer keeps, seeds or replays its examples."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = {"hypothesis", "hypothesis.strategies", "hypothesis.database",
                  "hypothesis.errors", "hypothesis.stateful", "hypothesis.extra.redis"}


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        # `from hypothesis import internal` imports a module too: name it in full.
        named = [f"hypothesis.{a.name}" for a in node.names if node.module == "hypothesis"]
        return [node.module] + [m for m in named if m.startswith("hypothesis.internal")]
    return []


def internal_uses(path: Path) -> list[str]:
    """Each line of `path` that reaches past Hypothesis's public API, as `file:line: why`."""
    text = path.read_text()
    problems = [(n, "_hypothesis_internal") for n, line in enumerate(text.splitlines(), 1)
                if "_hypothesis_internal" in line]
    for node in ast.walk(ast.parse(text)):
        for module in _imported_modules(node):
            if module.split(".")[0] == "hypothesis" and module not in PUBLIC_MODULES:
                problems.append((node.lineno, f"imports {module}"))
    return [f"{path.name}:{n}: {why}" for n, why in sorted(problems)]


def test_no_module_of_the_harness_reaches_past_hypothesis_public_api():
    files = [*sorted((ROOT / "harness").rglob("*.py")), ROOT / "conftest.py"]
    assert [p for f in files for p in internal_uses(f)] == []


def test_a_module_that_reached_into_hypothesis_internals_would_be_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from hypothesis import given, settings\n"
                   "from hypothesis.internal.reflection import function_digest\n"
                   "from hypothesis.reporting import with_reporter\n"
                   "import hypothesis.internal.conjecture.engine\n"
                   "from hypothesis import internal\n"
                   "def keyed(test):\n"
                   "    test._hypothesis_internal_database_key = b'k'\n")
    assert internal_uses(bad) == [
        "bad.py:2: imports hypothesis.internal.reflection",
        "bad.py:3: imports hypothesis.reporting",
        "bad.py:4: imports hypothesis.internal.conjecture.engine",
        "bad.py:5: imports hypothesis.internal",
        "bad.py:7: _hypothesis_internal"]
