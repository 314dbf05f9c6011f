"""A lane this machine cannot run stops in one line, never a green run of skips: the GPU
targets of the Makefile without a CUDA GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the lanes run")
@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
@pytest.mark.parametrize("target", ["test-gpu", "test-vllm-gpu", "bench-gpu"])
def test_a_gpu_lane_without_a_gpu_stops_at_once_in_one_line_naming_why(target):
    # -o: the environment counts as built (no rebuild of .venv from a test).
    done = subprocess.run(["make", "-s", "-o", ".venv/.installed", target], cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stdout == ""  # nothing ran: no pytest, no bundle, no bench
    lines = done.stderr.splitlines()
    assert lines[0] == (f"ERROR: make {target}: no CUDA GPU is visible here "
                        "(torch.cuda.is_available() is False)"), done.stderr
    # make[1]: when the test itself runs under make (make test).
    assert len(lines) == 2 and re.fullmatch(
        rf"make(\[\d+\])?: \*\*\* \[Makefile:\d+: {target}\] Error 3", lines[1]), done.stderr
