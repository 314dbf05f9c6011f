"""The torchrun world over several nodes: this node's torchrun agent on the c10d rendezvous,
the other nodes' agents started there (`python -m harness.world.node`), one DP world of
nnodes x nproc ranks fed by this driver.

A world is rebuilt the torchrun way: the driver closes every control connection and kills
its own node's workers; every worker watches its connection and exits when it closes, each
agent restarts its workers (a new rendezvous round, `--max-restarts`), and they connect to
the next world's driver address, published in the rendezvous store. The driver's own agent
lives until `close()`. A node all of whose ranks are lost at once is named `NodeLost`. Every
node's launcher stops its agent once this driver is gone (harness/world/heartbeat.py).
"""

from __future__ import annotations

import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness.errors import ConfigError
from harness.history.step_error import StepError
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.evidence import rank_evidence
from harness.world.heartbeat import DriverBeat
from harness.world.launch import WorldError, launch_world
from harness.world.nodes import (
    DriverAddress,
    NodeSpec,
    WorkerNode,
    advertised_host,
    node_command,
    node_environment,
    node_lost,
    publish_driver,
    shared_control_key,
)
from harness.world.processes import kill_all, wait_or_signal
from harness.world.torchrun import STOP_TIMEOUT_S, TorchrunWorld
from harness.world.wire import ChannelClosed

EXIT_GRACE_S = 10.0
BUILD_ATTEMPTS = 3  # for every worker to leave on "exit" and its agent to end


class MultiNodeWorld(TorchrunWorld):
    soft_rebuilds = False  # a fresh group would span hosts: relaunch instead
    def __init__(self, spec: NodeSpec, nproc_per_node: int, backend: str = "gloo",
                 timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None,
                 key: bytes | None = None) -> None:
        if backend != "gloo":
            raise ConfigError("backend", "multi-node worlds run gloo here (no GPU machine "
                              "with several nodes was at hand to check NCCL on)")
        super().__init__(spec.nnodes * nproc_per_node, backend, timeouts, device)
        self.spec = spec
        self.nproc_per_node = nproc_per_node
        self.key = key if key is not None else shared_control_key()
        self.host = advertised_host(spec)
        self._nodes: dict[int, WorkerNode] = {}
        self._agent_dir: Path | None = None
        self._beat: DriverBeat | None = None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Build the next world; a rank that failed to join (gloo's connect under load) costs
        one more round of the agents' restarts, at most BUILD_ATTEMPTS in all."""
        for attempt in range(1, BUILD_ATTEMPTS + 1):
            try:
                self._build()
                return
            except WorldError:
                if attempt == BUILD_ATTEMPTS or not self.alive:
                    self.close()
                    raise

    def _build(self) -> None:
        self._end_world()
        if self._agent_dir is None:
            self._agent_dir = Path(tempfile.mkdtemp(prefix="dbo-node-"))
        self._dir = self._agent_dir
        try:
            # Beyond loopback only when the rendezvous is.
            launch_world(self, self.key, self.host, self._launch)
        except WorldError:
            self._end_world()
            raise
        except (ChannelClosed, TimeoutError) as exc:
            # A worker its agent restarted between hello and ready: build again.
            self._end_world()
            raise WorldError(f"a worker left while the world was forming ({exc})") from exc
        except BaseException:
            self.close()
            raise
        # Workers a later restart brings up wait for the next world's address.
        publish_driver(self.spec, None)
        if self._beat is None:  # the store is up now: the agents see this driver live
            self._beat = DriverBeat(self.spec.rdzv_host, self.spec.rdzv_port)

    def _launch(self, port: int) -> None:
        if not self.alive:
            self._start_agent()
        publish_driver(self.spec, DriverAddress(self.host, port, secrets.token_hex(6)))

    def run(self, scenario):
        if not self._channels:  # the agents outlive a world: rebuild when its ranks are gone
            self.start()
        return super().run(scenario)

    def _start_agent(self) -> None:
        """This node's agent, through the node launcher every node runs; it watches this
        driver's pid and stops the agent when the driver is gone."""
        assert self._agent_dir is not None
        log = open(self._agent_dir / "torchrun.log", "ab")  # noqa: SIM115 - lives with the agent
        self._proc = subprocess.Popen(
            node_command(sys.executable, self.spec, self.nproc_per_node,
                         self.timeouts.collective_s, self.device, self._agent_dir),
            stdout=log, stderr=subprocess.STDOUT, env=node_environment(self.key),
            stdin=subprocess.DEVNULL, start_new_session=True)

    def _hello(self, rank: int, rest: tuple) -> None:
        if rest:
            self._nodes[rank] = WorkerNode(*rest[0])

    def _end_world(self) -> list[int]:
        """Close every connection (remote workers exit on it) and kill this host's workers;
        the agents restart theirs for the next world."""
        for channel in self._channels.values():
            channel.close()
        survivors = kill_all(self._local_pids())
        self._channels, self._pids = {}, {}
        return survivors

    def close(self) -> list[int]:
        """Every worker is told to exit (its agent then ends), then this node's launcher and
        agent are stopped; returns what of this host's world is still alive (must be
        nothing)."""
        if self._beat is not None:  # first, while the store is up: no thread left in it
            self._beat.stop()
        pids = self._local_pids() + self._local_agents()
        for channel in self._channels.values():
            try:
                channel.send(("exit",))
            except ConnectionError:
                pass
        if self._proc is not None:
            wait_or_signal(self._proc, EXIT_GRACE_S, signal.SIGTERM)
            wait_or_signal(self._proc, STOP_TIMEOUT_S, signal.SIGKILL)
            pids.append(self._proc.pid)
        for channel in self._channels.values():
            channel.close()
        deadline = time.monotonic() + EXIT_GRACE_S  # remote workers leave on their own
        while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
            time.sleep(0.1)
        survivors = kill_all(pids)
        self._channels, self._pids, self._proc, self._nodes = {}, {}, None, {}
        self._beat = None
        if self._agent_dir is not None:
            shutil.rmtree(self._agent_dir, ignore_errors=True)
            self._agent_dir = self._dir = None
        return survivors

    # -- per node ------------------------------------------------------------------------------

    def _on_this_host(self, rank: int) -> bool:
        node = self._nodes.get(rank)
        return node is not None and node.host == socket.gethostname()

    def _local_agents(self) -> list[int]:
        return sorted({node.agent_pid for rank, node in self._nodes.items()
                       if self._on_this_host(rank)})

    def _local_pids(self) -> list[int]:
        """Workers this driver can signal: those on this host (every node, on loopback)."""
        return [pid for rank, pid in self._pids.items() if self._on_this_host(rank)]

    def node_of(self) -> dict[int, int]:
        return {rank: node.group_rank for rank, node in self._nodes.items()}

    def agent_pids(self) -> dict[int, int]:
        """Each node's torchrun agent, by its place in the world."""
        return {node.group_rank: node.agent_pid for node in self._nodes.values()}

    def _agent_lost(self, rank: int, agent_pid: int) -> StepError:
        node = self._nodes.get(rank)
        where = f"node {node.group_rank}, on {node.host}" if node else "its node"
        return node_lost(where, agent_pid)

    def _trace_dir_of(self, rank: int) -> Path | None:
        # A node elsewhere keeps its traces there: its path names nothing here.
        node = self._nodes.get(rank)
        return Path(node.trace_dir) if node is not None else self._dir

    def _rank_evidence(self, headline: str) -> str:
        """Each node's ranks' stacks and collective traces, read where the driver can reach
        them (this host); of a node elsewhere, where its evidence lies."""
        parts = [headline]
        for group in sorted(set(self.node_of().values())):
            ranks = sorted(r for r, n in self.node_of().items() if n == group)
            node = self._nodes[ranks[0]]
            title = f"node {group} on {node.host} (agent pid {node.agent_pid})"
            if not self._on_this_host(ranks[0]):
                parts.append(f"{title}: stacks and traces of ranks {ranks} are in "
                             f"{node.trace_dir} there")
                continue
            pids = {r: self._pids[r] for r in ranks if r in self._pids}
            parts.append(rank_evidence(title, Path(node.trace_dir), pids, self.nproc, ranks))
        return "\n".join(parts)
