"""The torchrun world over several nodes: this node's torchrun agent on the c10d rendezvous,
the other nodes' agents started there (`python -m harness.world.node`), one DP world of
nnodes x nproc ranks fed by this driver.

A world is rebuilt the torchrun way: the driver closes every control connection and kills
its own node's workers; every worker watches its connection and exits when it closes, each
agent restarts its workers (a new rendezvous round, `--max-restarts`), and they connect to
the next world's driver address, published in the rendezvous store. The driver's own agent
lives until `close()`. A node all of whose ranks are lost at once is named `NodeLost`. Every
node's launcher stops its agent once this driver is gone (harness/world/multinode/heartbeat.py).
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
from typing import Protocol

import psutil

from harness.errors import ConfigError
from harness.history.step_error import StepError
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.channel.control_server import ControlServer
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import Exit, WorkerHello
from harness.world.channel.wire import ChannelClosed
from harness.world.evidence import rank_evidence
from harness.world.multinode.heartbeat import DriverBeat, clear_end_mark
from harness.world.multinode.nodes import (
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
from harness.world.processes.lifecycle import kill_all, wait_or_signal
from harness.world.torchrun.agent_launch import STOP_TIMEOUT_S
from harness.world.torchrun.backends import check_backend, rank_device
from harness.world.torchrun.launch import Formation, WorldError
from harness.world.torchrun.world import TorchrunWorld
from harness.world.trace_layout import TraceLayout

EXIT_GRACE_S = 10.0
BUILD_ATTEMPTS = 3  # for every worker to leave on "exit" and its agent to end


class OtherNodes(Protocol):
    """The other nodes' launchers, where this driver starts them (loopback.py)."""

    def ensure_up(self, timeouts: Timeouts) -> None: ...

    def pids(self) -> list[int]: ...

    def stop(self) -> None: ...


def multi_node_world(spec: NodeSpec, nproc_per_node: int, backend: str = "gloo",
                     timeouts: Timeouts = DEFAULT_TIMEOUTS, device: str | None = None,
                     key: bytes | None = None, others: OtherNodes | None = None
                     ) -> TorchrunWorld:
    """This node's part of a world of `spec.nnodes` nodes; `others`: the other nodes'
    launchers when this driver starts them (None: each node runs its own)."""
    if backend != "gloo":
        raise ConfigError("backend", "multi-node worlds run gloo here (no GPU machine "
                          "with several nodes was at hand to check NCCL on)")
    nproc = spec.nnodes * nproc_per_node
    check_backend(backend, nproc, device)
    rig = NodeAgents(spec, nproc_per_node, rank_device(backend, device), key, others)
    return TorchrunWorld(nproc, backend, timeouts, device, rig=rig)


class NodeAgents:
    """The rig of a multi-node world: agents that outlive the worlds they serve."""

    soft_rebuilds = False  # a fresh group would span hosts: relaunch instead

    def __init__(self, spec: NodeSpec, nproc_per_node: int, device: str,
                 key: bytes | None = None, others: OtherNodes | None = None) -> None:
        self.spec, self.nproc_per_node, self.device = spec, nproc_per_node, device
        self.nproc = spec.nnodes * nproc_per_node
        self.key = key if key is not None else shared_control_key()
        self.host = advertised_host(spec)
        self.others = others
        self._nodes: dict[int, WorkerNode] = {}
        self._agent_dir: Path | None = None
        self._beat: DriverBeat | None = None
        self._ended = False  # this driver marked a world ended in the store
        self._proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def agent_pid(self) -> int | None:
        """This node's launcher (its agent runs under it)."""
        return self._proc.pid if self._proc is not None else None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, links: RankLinks, formation: Formation, timeouts: Timeouts) -> None:
        """Build the next world; a rank that failed to join (gloo's connect under load) costs
        one more round of the agents' restarts, at most BUILD_ATTEMPTS in all."""
        if self.others is not None:
            self.others.ensure_up(timeouts)
        if self._ended:  # nodes that outlived that end must not stop for it now
            clear_end_mark(self.spec.rdzv_host, self.spec.rdzv_port)
            self._ended = False
        for attempt in range(1, BUILD_ATTEMPTS + 1):
            try:
                self._build(links, formation, timeouts)
                return
            except WorldError:
                if attempt == BUILD_ATTEMPTS or not self.alive:
                    self.close(links)
                    raise

    def _build(self, links: RankLinks, formation: Formation, timeouts: Timeouts) -> None:
        self.end_world(links, timeouts)
        if self._agent_dir is None:
            self._agent_dir = Path(tempfile.mkdtemp(prefix="dbo-node-"))
        try:
            # Beyond loopback only when the rendezvous is.
            server = ControlServer(self.key, host=self.host)
            formation.take_in(server, links, self._launcher_alive, self._hello,
                              lambda port: self._launch(port, timeouts))
        except WorldError:
            self.end_world(links, timeouts)
            raise
        except (ChannelClosed, TimeoutError) as exc:
            # A worker its agent restarted between hello and ready: build again.
            self.end_world(links, timeouts)
            raise WorldError(f"a worker left while the world was forming ({exc})") from exc
        except BaseException:
            self.close(links)
            raise
        # Workers a later restart brings up wait for the next world's address.
        publish_driver(self.spec, None)
        if self._beat is None:  # the store is up now: the agents see this driver live
            self._beat = DriverBeat(self.spec.rdzv_host, self.spec.rdzv_port)

    def _launch(self, port: int, timeouts: Timeouts) -> None:
        if not self.alive:
            self._start_agent(timeouts)
        publish_driver(self.spec, DriverAddress(self.host, port, secrets.token_hex(6)))

    def _start_agent(self, timeouts: Timeouts) -> None:
        """This node's agent, through the node launcher every node runs; it watches this
        driver's pid and stops the agent when the driver is gone."""
        assert self._agent_dir is not None
        log = open(TraceLayout(self._agent_dir).torchrun_log, "ab")  # lives with the agent
        self._proc = subprocess.Popen(
            node_command(sys.executable, self.spec, self.nproc_per_node,
                         timeouts.collective_s, self.device, self._agent_dir),
            stdout=log, stderr=subprocess.STDOUT, env=node_environment(self.key),
            stdin=subprocess.DEVNULL, start_new_session=True)

    def _launcher_alive(self) -> None:
        if not self.alive:
            log = TraceLayout(self._agent_dir).torchrun_log if self._agent_dir else None
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise WorldError(f"torchrun exited with {self._proc.returncode} before every "
                             "worker connected", tail)

    def _hello(self, hello: WorkerHello) -> None:
        self._nodes[hello.rank] = hello.node

    def end_world(self, links: RankLinks, timeouts: Timeouts, at_once: bool = False) -> list[int]:
        """Close every connection (remote workers exit on it) and kill this host's workers, at
        once in any case; the agents restart theirs for the next world."""
        pids = self._local_pids(links)
        links.close()
        return kill_all(pids)

    def close(self, links: RankLinks) -> list[int]:
        """Every worker is told to exit (its agent then ends), then this node's launcher and
        agent are stopped (and the other nodes', where this driver started them); returns
        what of this host's world is still alive (must be nothing)."""
        if self._beat is not None:  # first, while the store is up: no thread left in it
            self._beat.end()
            self._ended = True
        pids = self._local_pids(links) + self._local_agents()
        links.send_to_all(Exit())
        if self._proc is not None:
            wait_or_signal(self._proc, EXIT_GRACE_S, signal.SIGTERM)
            wait_or_signal(self._proc, STOP_TIMEOUT_S, signal.SIGKILL)
            pids.append(self._proc.pid)
        links.close()
        deadline = time.monotonic() + EXIT_GRACE_S  # remote workers leave on their own
        while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
            time.sleep(0.1)
        survivors = kill_all(pids)
        self._proc, self._nodes, self._beat = None, {}, None
        if self._agent_dir is not None:
            shutil.rmtree(self._agent_dir, ignore_errors=True)
            self._agent_dir = None
        if self.others is not None:
            self.others.stop()
        return survivors

    # -- per node ------------------------------------------------------------------------------

    def _on_this_host(self, rank: int) -> bool:
        node = self._nodes.get(rank)
        return node is not None and node.host == socket.gethostname()

    def _local_agents(self) -> list[int]:
        return sorted({node.agent_pid for rank, node in self._nodes.items()
                       if self._on_this_host(rank)})

    def _local_pids(self, links: RankLinks) -> list[int]:
        """Workers this driver can signal: those on this host (every node, on loopback)."""
        return [pid for rank, pid in links.pids.items() if self._on_this_host(rank)]

    def node_of(self) -> dict[int, int]:
        return {rank: node.group_rank for rank, node in self._nodes.items()}

    def agent_pids(self) -> dict[int, int]:
        """Each node's torchrun agent, by its place in the world."""
        return {node.group_rank: node.agent_pid for node in self._nodes.values()}

    def node_launchers(self) -> list[int]:
        """The other nodes' launchers this driver started (none on a real cluster)."""
        return self.others.pids() if self.others is not None else []

    def agent_lost(self, rank: int, agent_pid: int) -> StepError:
        node = self._nodes.get(rank)
        where = f"node {node.group_rank}, on {node.host}" if node else "its node"
        return node_lost(where, agent_pid)

    def trace_dir_of(self, rank: int) -> Path | None:
        # A node elsewhere keeps its traces there: its path names nothing here.
        node = self._nodes.get(rank)
        return Path(node.trace_dir) if node is not None else self._agent_dir

    def rank_evidence(self, headline: str, links: RankLinks) -> str:
        """Each node's ranks' stacks and collective traces, read where the driver can reach
        them (this host); of a node elsewhere, where its evidence lies."""
        parts = [headline]
        pids = links.pids
        for group in sorted(set(self.node_of().values())):
            ranks = sorted(r for r, n in self.node_of().items() if n == group)
            node = self._nodes[ranks[0]]
            title = f"node {group} on {node.host} (agent pid {node.agent_pid})"
            if not self._on_this_host(ranks[0]):
                parts.append(f"{title}: stacks and traces of ranks {ranks} are in "
                             f"{node.trace_dir} there")
                continue
            mine = {r: pids[r] for r in ranks if r in pids}
            parts.append(rank_evidence(title, Path(node.trace_dir), mine, self.nproc, ranks))
        return "\n".join(parts)
