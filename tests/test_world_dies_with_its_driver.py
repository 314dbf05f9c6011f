"""A world's agent and ranks die with the driver that started them, even where a rank is
stuck where its own watchdog cannot run (harness/world/torchrun/agent_guard.py, parent_death.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from process_watch import alive, gone_within

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[1]

# A driver that launches one rank the way the torchrun world does, then waits to be killed.
_DRIVER = """
import os, subprocess, sys, time
from harness.world.processes.lifecycle import package_pythonpath
port, trace_dir = sys.argv[1], sys.argv[2]
me = str(os.getpid())
env = dict(os.environ, DBO_HARNESS_CONTROL_KEY="ab" * 32, PYTHONPATH=package_pythonpath())
agent = subprocess.Popen(
    [sys.executable, "-m", "harness.world.torchrun.agent_guard", "--driver-pid", me, "--",
     "--standalone", "--nproc-per-node=1", "--max-restarts=0",
     "-m", "harness.world.torchrun.worker",
     "--control", f"127.0.0.1:{port}", "--driver-pid", me, "--trace-dir", trace_dir],
    env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(agent.pid, flush=True)
time.sleep(600)
"""


def test_a_rank_stuck_before_its_watchdog_starts_dies_with_a_killed_driver(tmp_path):
    # The rank connects here and waits for a handshake that never comes: it is stuck before
    # its watchdog thread exists, as a rank spinning in CUDA with the GIL is stuck after.
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(60)
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(silent.getsockname()[1]),
                               str(tmp_path)], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              start_new_session=True)
    pids: list[int] = []
    try:
        agent = int(driver.stdout.readline())
        connection, _ = silent.accept()  # the rank is up and blocked in the handshake
        pids = [agent] + [c.pid for c in psutil.Process(agent).children(recursive=True)]
        assert len(pids) == 2, pids
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        assert gone_within(pids, 20) == []
        connection.close()
    finally:
        silent.close()
        for pid in [driver.pid, *pids]:  # whatever a failing run left
            if alive([pid]):
                os.kill(pid, signal.SIGKILL)
