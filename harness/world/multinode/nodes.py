"""Worlds over several nodes, on torchrun's own c10d rendezvous.

Every node runs one torchrun agent (`--nnodes N --rdzv-backend c10d --rdzv-endpoint
HOST:PORT`); the agents rendezvous at the endpoint's store and their workers form one DP world
of N x nproc ranks. The driver runs on one node and publishes where it listens in that store
(`CONTROL_STORE_KEY`: host, port and which world it is building); every worker reads it there
and connects. What it reads is not trusted: both ends still prove they hold the world's key
(taken from each node's environment, never a command line) before a message is read.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
from dataclasses import dataclass
from datetime import timedelta

from harness.errors import ConfigError, ErrorOrigin
from harness.history.step_error import StepError
from harness.world.channel.messages import WorkerNode
from harness.world.channel.wire import CONTROL_KEY_ENV
from harness.world.processes.lifecycle import package_pythonpath

CONTROL_STORE_KEY = "dbo-harness/control"
RDZV_ID = "dbo-harness"
MAX_REBUILDS = 100  # torchrun's --max-restarts: each rebuild of the world is one restart
STORE_TIMEOUT_S = 30.0
DRIVER_NODE_S = 24 * 3600.0


@dataclass(frozen=True)
class NodeSpec:
    """This node's place in a multi-node world."""

    nnodes: int
    node_rank: int
    rdzv_host: str
    rdzv_port: int
    rdzv_id: str = RDZV_ID

    @property
    def endpoint(self) -> str:
        host = f"[{self.rdzv_host}]" if ":" in self.rdzv_host else self.rdzv_host
        return f"{host}:{self.rdzv_port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.rdzv_host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def node_spec(nnodes: int, node_rank: int, endpoint: str | None,
              rdzv_id: str = RDZV_ID) -> NodeSpec:
    """Checked flags; a ConfigError names the field."""
    if nnodes < 2:
        raise ConfigError("nnodes", f"a multi-node world needs at least 2 nodes, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ConfigError("node_rank", f"must be 0 to {nnodes - 1}, got {node_rank}")
    if not endpoint:
        raise ConfigError("rdzv_endpoint", "a multi-node world needs HOST:PORT of the "
                          "rendezvous (the node that hosts it listens there)")
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("rdzv_endpoint", f"{endpoint!r} is not HOST:PORT")
    return NodeSpec(nnodes, node_rank, host, int(port), rdzv_id)


def shared_control_key() -> bytes:
    """Every node's workers must hold the key, so a multi-node world takes it from the
    environment (set on every node, e.g. from the cluster's secret store), never a flag."""
    value = os.environ.get(CONTROL_KEY_ENV, "")
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ConfigError("control_key", f"a multi-node world needs {CONTROL_KEY_ENV} set to "
                          "the same hex secret (16 bytes or more) on every node")
    return key


def agent_command(python: str, spec: NodeSpec, nproc: int, worker_args: list[str]) -> list[str]:
    """This node's torchrun agent: c10d rendezvous, rebuilds as torchrun restarts."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={spec.nnodes}",
            f"--node-rank={spec.node_rank}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.endpoint}",
            f"--rdzv-id={spec.rdzv_id}", f"--max-restarts={MAX_REBUILDS}",
            # On loopback every agent matches the endpoint's host: node 0 hosts the store.
            *([f"--rdzv-conf=is_host={int(spec.node_rank == 0)}"] if spec.loopback else []),
            "-m", "harness.world.torchrun.worker", "--control-store", spec.endpoint, *worker_args]


def node_command(python: str, spec: NodeSpec, nproc: int, collective_s: float,
                 device: str = "cpu", trace_dir=None) -> list[str]:
    """A node the driver starts on its own host (its own, or every node on loopback): the
    node launcher, watching the driver's pid; bounded by the driver's life (and a day)."""
    return [python, "-m", "harness.world.node", f"--nnodes={spec.nnodes}",
            f"--node-rank={spec.node_rank}", f"--rdzv-endpoint={spec.endpoint}",
            f"--nproc={nproc}", f"--collective-timeout={collective_s}", f"--device={device}",
            f"--driver-pid={os.getpid()}", f"--seconds={DRIVER_NODE_S:.0f}",
            *([f"--trace-dir={trace_dir}"] if trace_dir is not None else [])]


def node_environment(key: bytes) -> dict[str, str]:
    """A node launcher's environment: this package, and the world's key (never a flag)."""
    return dict(os.environ, PYTHONPATH=package_pythonpath(), **{CONTROL_KEY_ENV: key.hex()})


def hosts_rendezvous(spec: NodeSpec) -> bool:
    """Whether this node's agent hosts the rendezvous store: node 0 on loopback (as
    agent_command tells it), else a node one of whose addresses is the endpoint's host."""
    if spec.loopback:
        return spec.node_rank == 0
    family = socket.AF_INET6 if ":" in spec.rdzv_host else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((spec.rdzv_host, 0))
    except OSError:  # not an address of this machine (or a name that does not resolve)
        return False
    return True


def advertised_host(spec: NodeSpec) -> str:
    """The address other nodes reach this one at: loopback for a loopback rendezvous, else
    the local address of the route to the rendezvous host (no packet is sent)."""
    if spec.loopback:
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in spec.rdzv_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((spec.rdzv_host, spec.rdzv_port))
        return s.getsockname()[0]


def _store(host: str, port: int, timeout_s: float):
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class DriverAddress:
    host: str
    port: int
    launch: str  # which world: the arrival count of each world is kept apart by it

    def encode(self) -> bytes:
        return f"{self.host} {self.port} {self.launch}".encode()


def publish_driver(spec: NodeSpec, address: DriverAddress | None) -> None:
    """Say where the driver listens for the next world (None: withdraw, so that workers
    restarted before the next world is built wait for it instead of a closed port)."""
    store = _store(spec.rdzv_host, spec.rdzv_port, STORE_TIMEOUT_S)
    if address is None:
        store.delete_key(CONTROL_STORE_KEY)
    else:
        store.set(CONTROL_STORE_KEY, address.encode())


def driver_address(endpoint: str, timeout_s: float) -> DriverAddress:
    """A worker's side: wait (bounded) for the driver's address in the rendezvous store."""
    host, _, port = endpoint.rpartition(":")
    store = _store(host.strip("[]"), int(port), timeout_s)
    store.wait([CONTROL_STORE_KEY], timedelta(seconds=timeout_s))
    text = store.get(CONTROL_STORE_KEY).decode()
    h, p, launch = text.split(" ")
    return DriverAddress(h, int(p), launch)


def world_group_args(launch: str, timeout_s: float) -> dict:
    """`init_process_group`'s store for one world. The agents' TCPStore outlives their
    rendezvous rounds, so without a prefix of its own a rank of the next world reads gloo's
    addresses of the last one (a connect to a dead port: the rebuild failed on it)."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=timeout_s))
    return {"store": dist.PrefixStore(f"dbo-harness/world-{launch}", store),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def peer_closed(fd: int) -> bool:
    """The far end of a connected socket closed it (peeked: nothing is consumed)."""
    try:
        readable, _, _ = select.select([fd], [], [], 0)
        if not readable:
            return False
        sock = socket.socket(fileno=os.dup(fd))
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        finally:
            sock.close()
    except BlockingIOError:
        return False
    except OSError:
        return True


def worker_node(trace_dir) -> WorkerNode:
    """Where this worker runs, for its hello."""
    return WorkerNode(socket.gethostname(), os.getppid(), int(os.environ.get("GROUP_RANK", 0)),
                      str(trace_dir))


def node_lost(where: str, agent_pid: int) -> StepError:
    """A rank whose node's torchrun agent died (its worker said so on the way out): the
    node is gone, not the rank alone."""
    return StepError("NodeLost", f"was on {where}, whose torchrun agent (pid {agent_pid}) "
                     "died", None, ErrorOrigin.NODE_LOST)
