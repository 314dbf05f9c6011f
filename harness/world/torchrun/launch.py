"""How a torchrun world forms, for one node and for many: the driver listens on the
authenticated control channel, something is started (or woken) that brings the workers up,
and every worker says hello over it, then that it joined the process group.

A world's rig decides what is started and how a failed launch is cleaned up; the server
closes whatever happens, and `Formation` keeps what it saw (its port while workers connect,
the strangers dropped, the launches).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.errors import HarnessCannot
from harness.world.channel.control_server import ControlServer
from harness.world.channel.links import RankLinks
from harness.world.channel.messages import WorkerCannot, WorkerHello, WorkerReady
from harness.world.channel.wire import expect_hello

LAUNCH_TIMEOUT_S = 90.0  # torchrun start plus `import torch` in every worker
HELLO_TIMEOUT_S = 30.0  # an authenticated worker says who it is


class WorldError(HarnessCannot):
    """The world could not be started (torchrun failed, or workers never connected): one
    line, exit 3; a worker's traceback or a log is the detail."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__("world", message, detail)


class Formation:
    """The launches of one world, counted as they form: read by tests and benchmarks."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.launches = 0
        self.listening_port: int | None = None  # the control port while workers connect
        self.strangers_dropped = 0  # connections that failed the handshake, over all launches

    def take_in(self, server: ControlServer, links: RankLinks,
                launcher_alive: Callable[[], None], on_hello: Callable[[WorkerHello], None],
                launch: Callable[[int], None] | None = None) -> None:
        """Call `launch(port)` (when given), then take every worker in over `server`, which
        is closed at the end (WorldError, ChannelClosed or TimeoutError when the world does
        not form)."""
        self.listening_port = server.port
        try:
            if launch is not None:
                launch(server.port)
            self.launches += 1
            accept_workers(links, self.nproc, server, launcher_alive, on_hello)
        finally:
            self.strangers_dropped += server.dropped
            server.close()
            self.listening_port = None


def accept_workers(links: RankLinks, nproc: int, server: ControlServer,
                   launcher_alive: Callable[[], None],
                   on_hello: Callable[[WorkerHello], None]) -> None:
    """Every worker, authenticated, says hello, then that it joined the group.
    `launcher_alive` raises WorldError once what launches the workers is gone; a worker of
    another protocol version is a VersionMismatch (one line, naming both)."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while len(links) < nproc:
        try:
            channel = server.accept(deadline, launcher_alive)
        except TimeoutError:
            raise WorldError(f"only {len(links)} of {nproc} workers "
                             f"connected within {LAUNCH_TIMEOUT_S:.0f} s") from None
        hello = expect_hello(channel, WorkerHello, HELLO_TIMEOUT_S)
        links.add(hello.rank, channel, hello.pid)
        on_hello(hello)
    for rank in links.ranks():
        message = links.recv(rank, max(1.0, deadline - time.monotonic()))
        if isinstance(message, WorkerCannot):
            said = message.message if message.what == "world" else \
                f"{message.what}: {message.message}"
            raise WorldError(f"rank {rank} failed to join the process group: {said}",
                             message.traceback)
        if not isinstance(message, WorkerReady):
            raise WorldError(f"rank {rank} failed to join the process group: it said "
                             f"{type(message).__name__}")
