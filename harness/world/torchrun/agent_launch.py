"""One launch of a world's torchrun agent, with the control server its ranks call back to.

A launch may be started before it is needed (a spare): its ranks import torch, pass the
handshake and join their group in the background while the live world runs, so a rebuild
after a failure costs reading two messages per rank instead of a cold start (on the H200,
about 10 s: `import torch` takes 4-5 s in the agent and again in each rank).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.world.channel.control_server import ControlServer
from harness.world.channel.wire import CONTROL_KEY_ENV, new_control_key
from harness.world.processes.lifecycle import kill_all, package_pythonpath, wait_or_signal
from harness.world.torchrun import rank_shim
from harness.world.trace_layout import TraceLayout

STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AgentLaunch:
    proc: subprocess.Popen
    server: ControlServer
    trace_dir: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> list[int]:
        """Stop a launch that was never taken: agent, ranks and server. The pids left alive
        (must be empty)."""
        try:
            ranks = [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            ranks = []
        self.server.close()
        wait_or_signal(self.proc, 0.0, signal.SIGTERM)
        wait_or_signal(self.proc, STOP_TIMEOUT_S, signal.SIGKILL)
        survivors = kill_all(ranks)
        shutil.rmtree(self.trace_dir, ignore_errors=True)
        return survivors


def launch_agent(nproc: int, worker_args: list[str],
                 zygote_env: dict[str, str] | None = None) -> AgentLaunch:
    """Start torchrun's agent with `nproc` ranks of harness.world.torchrun.worker, tied to this
    process (harness/world/torchrun/agent_guard.py); the ranks get a fresh key by environment.
    `zygote_env`: torchrun starts rank shims instead, whose ranks a zygote forks
    (harness/world/torchrun/rank_zygote.py); this is what the shims need to reach it."""
    trace_dir = Path(tempfile.mkdtemp(prefix="dbo-world-"))
    key = new_control_key()  # fresh per launch; reaches the workers by environment only
    server = ControlServer(key)
    me = str(os.getpid())
    # The shim runs as a script: importing the package would import torch, what it saves.
    rank = ([str(Path(rank_shim.__file__))] if zygote_env
            else ["-m", "harness.world.torchrun.worker"])
    cmd = [sys.executable, "-m", "harness.world.torchrun.agent_guard", "--driver-pid", me, "--",
           "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
           *rank, "--control", f"127.0.0.1:{server.port}",
           "--driver-pid", me, "--trace-dir", str(trace_dir), *worker_args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_pythonpath(),
               **{CONTROL_KEY_ENV: key.hex()}, **(zygote_env or {}))
    try:
        with open(TraceLayout(trace_dir).torchrun_log, "wb") as log:  # the agent keeps its own copy
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
    except BaseException:
        server.close()
        shutil.rmtree(trace_dir, ignore_errors=True)
        raise
    return AgentLaunch(proc, server, trace_dir)


MAX_SPARES = 3


def spares_by_default(nproc: int, backend: str = "gloo") -> int:
    """One spare where the cores can boot it beside a running world without starving it (a
    GPU host); none on a small machine, where it would steal the live ranks' time. NCCL: a
    spare boots in about 7 s (CUDA context, communicator) while a faulted example costs 2-3 s
    (H100, 2 ranks sharing it), so failures back to back need several booting at once."""
    cores = os.cpu_count() or 1
    if cores < 2 * nproc + 4:
        return 0
    return min(MAX_SPARES, cores // (nproc + 2)) if backend == "nccl" else 1
