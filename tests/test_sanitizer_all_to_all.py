"""Under PyTorch's CUDA sanitizer, the harness's all-to-all must count as a write of its
receive buffer (harness/runtime/sanitizer.py `announce_written`): c10d's op marks none, so
without it a read of the receive on another stream with no event wait goes unreported (the
blind spot of docs/spec.md §11.4). Each case runs in a fresh process, as the sanitizer is
enabled by `TORCH_CUDA_SANITIZER=1` when torch is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (the sanitizer tracks CUDA streams)"),
]

# Receive on a side stream, then read on the default stream, with or without an event wait.
SCRIPT = """
import sys, torch
from harness.runtime.comm import EagerAllToAll
from harness.world.gpu.group import open_cuda_group
opened = open_cuda_group(torch.device("cuda", 0), 30.0)
inp = torch.arange(8, dtype=torch.float32, device="cuda")
out = torch.zeros_like(inp)
comm, main = torch.cuda.Stream(), torch.cuda.current_stream()
comm.wait_stream(main)
with torch.cuda.stream(comm):
    EagerAllToAll(opened.group, 30.0)(out, inp)()
    done = torch.cuda.Event()
    done.record()
if sys.argv[1] == "ordered":
    main.wait_event(done)
print("sum", float((out * 2).sum()))
torch.cuda.synchronize()
"""


def run_sanitized(order: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_CUDA_SANITIZER": "1"}
    return subprocess.run([sys.executable, "-c", SCRIPT, order], env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, check=False)


def test_a_receive_read_on_another_stream_without_a_wait_is_reported():
    result = run_sanitized("unordered")
    assert result.returncode != 0
    assert "CUDASanitizerErrors" in result.stderr, result.stderr[-2000:]


def test_the_same_read_after_an_event_wait_is_clean():
    result = run_sanitized("ordered")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sum 56.0" in result.stdout
