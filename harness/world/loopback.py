"""A multi-node world on one machine: the driver's node plus N-1 more nodes, each its own
torchrun agent (`python -m harness.world.node`), on a loopback rendezvous whose port is
picked at run time. For tests and benchmarks of the multi-node path; a real cluster runs the
node command on each machine instead.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.multinode import MultiNodeWorld
from harness.world.nodes import node_command, node_environment, node_spec
from harness.world.processes import wait_or_signal
from harness.world.wire import new_control_key

STOP_GRACE_S = 15.0


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackMultiNodeWorld(MultiNodeWorld):
    """`nnodes` agents of `nproc_per_node` ranks on 127.0.0.1; node 0 is the driver's."""

    def __init__(self, nnodes: int, nproc_per_node: int,
                 timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        spec = node_spec(nnodes, 0, f"127.0.0.1:{free_loopback_port()}")
        super().__init__(spec, nproc_per_node, "gloo", timeouts, None, new_control_key())
        self._others: list[subprocess.Popen] = []
        self.node_logs: list[Path] = []

    def start(self) -> None:
        if not self._others or any(p.poll() is not None for p in self._others):
            self._stop_others()
            self._start_others()
        super().start()

    def _start_others(self) -> None:
        for rank in range(1, self.spec.nnodes):
            command = node_command(sys.executable, replace(self.spec, node_rank=rank),
                                   self.nproc_per_node, self.timeouts.collective_s)
            self._others.append(subprocess.Popen(
                command, env=node_environment(self.key), stdin=subprocess.DEVNULL,
                stdout=self._log(rank), stderr=subprocess.STDOUT, start_new_session=True))

    def _log(self, rank: int):
        path = Path(tempfile.gettempdir()) / f"dbo-loopback-{self.spec.rdzv_port}-node{rank}.log"
        self.node_logs.append(path)
        return path.open("ab")

    def node_launchers(self) -> list[int]:
        return [p.pid for p in self._others]

    def _stop_others(self) -> None:
        for proc in self._others:
            wait_or_signal(proc, 0.0, signal.SIGTERM)
            wait_or_signal(proc, STOP_GRACE_S, signal.SIGKILL)
        self._others = []
        for path in self.node_logs:
            path.unlink(missing_ok=True)
        self.node_logs = []

    def close(self) -> list[int]:
        survivors = super().close()
        self._stop_others()
        return survivors
