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
from harness.world.channel.wire import new_control_key
from harness.world.multinode.nodes import NodeSpec, node_command, node_environment, node_spec
from harness.world.multinode.world import multi_node_world
from harness.world.processes.lifecycle import wait_or_signal
from harness.world.torchrun.world import TorchrunWorld

STOP_GRACE_S = 15.0


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_multi_node_world(nnodes: int, nproc_per_node: int,
                              timeouts: Timeouts = DEFAULT_TIMEOUTS) -> TorchrunWorld:
    """`nnodes` agents of `nproc_per_node` ranks on 127.0.0.1; node 0 is the driver's."""
    spec = node_spec(nnodes, 0, f"127.0.0.1:{free_loopback_port()}")
    key = new_control_key()
    return multi_node_world(spec, nproc_per_node, "gloo", timeouts, None, key,
                            LoopbackNodes(spec, nproc_per_node, key))


class LoopbackNodes:
    """Nodes 1..N-1 of a loopback world, each a node launcher this driver starts."""

    def __init__(self, spec: NodeSpec, nproc_per_node: int, key: bytes) -> None:
        self.spec, self.nproc_per_node, self.key = spec, nproc_per_node, key
        self._procs: list[subprocess.Popen] = []
        self.node_logs: list[Path] = []

    def ensure_up(self, timeouts: Timeouts) -> None:
        """Every other node running (all of them started again if one is gone)."""
        if not self._procs or any(p.poll() is not None for p in self._procs):
            self.stop()
            self._start(timeouts)

    def _start(self, timeouts: Timeouts) -> None:
        for rank in range(1, self.spec.nnodes):
            command = node_command(sys.executable, replace(self.spec, node_rank=rank),
                                   self.nproc_per_node, timeouts.collective_s)
            self._procs.append(subprocess.Popen(
                command, env=node_environment(self.key), stdin=subprocess.DEVNULL,
                stdout=self._log(rank), stderr=subprocess.STDOUT, start_new_session=True))

    def _log(self, rank: int):
        path = Path(tempfile.gettempdir()) / f"dbo-loopback-{self.spec.rdzv_port}-node{rank}.log"
        self.node_logs.append(path)
        return path.open("ab")

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def stop(self) -> None:
        for proc in self._procs:
            wait_or_signal(proc, 0.0, signal.SIGTERM)
            wait_or_signal(proc, STOP_GRACE_S, signal.SIGKILL)
        self._procs = []
        for path in self.node_logs:
            path.unlink(missing_ok=True)
        self.node_logs = []
