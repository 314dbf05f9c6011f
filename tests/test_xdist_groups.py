"""`--dist loadgroup` keeps a module marked with one `xdist_group` on one worker, so its
module-scoped world boots once (`make test-vllm` relies on it; pytest 9.2 with xdist 3.8 broke
it, hence pyproject.toml's pin): run on a throwaway test tree in a pytest of its own, with two
workers, under the pytest and xdist installed here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GROUPED = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("one-world")


@pytest.fixture(scope="module")
def world():
    with open(os.environ["BOOTS"], "a") as boots:
        boots.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_grouped(world, i):
    pass
'''

LOOSE = '''
import pytest


@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    pass
'''


def run_loadgroup(tmp_path: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Which workers ran each file's tests, and one line per boot of the grouped world."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    boots = tmp_path / "boots.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BOOTS": str(boots)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "loadgroup", "-v", "--rootdir", str(tmp_path),
         "-c", str(tmp_path / "pytest.ini"), "test_grouped.py", "test_loose.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, name in re.findall(r"\[(gw\d)\] .*PASSED (test_\w+)\.py::", done.stdout):
        workers.setdefault(name, set()).add(worker)
    return workers, boots.read_text().split()


def test_a_grouped_module_runs_on_one_worker_and_boots_its_world_once(tmp_path):
    workers, boots = run_loadgroup(tmp_path)
    assert len(workers["test_grouped"]) == 1, workers
    assert len(boots) == 1, boots
    # The tests without a group still spread over both workers.
    assert workers["test_grouped"] | workers["test_loose"] == {"gw0", "gw1"}, workers
