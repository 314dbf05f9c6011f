"""How a torchrun world forms, for one node and for many: the driver listens on the
authenticated control channel, something is started (or woken) that brings the workers up,
and every worker says hello over it, then that it joined the process group.

A world's own code decides what is started and how a failed launch is cleaned up; the
server closes whatever happens, and the world keeps what it saw (its port while workers
connect, the strangers dropped, the launches).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Protocol

from harness.world.control_server import ControlServer
from harness.world.wire import Channel

LAUNCH_TIMEOUT_S = 90.0  # torchrun start plus `import torch` in every worker


class WorldError(RuntimeError):
    """The world could not be started (torchrun failed, or workers never connected)."""


class Launching(Protocol):
    nproc: int
    launches: int
    listening_port: int | None
    strangers_dropped: int
    _channels: dict[int, Channel]
    _pids: dict[int, int]
    _proc: subprocess.Popen | None

    @property
    def alive(self) -> bool: ...

    def _hello(self, rank: int, rest: tuple) -> None: ...

    def _log_tail(self) -> str: ...


def launch_world(world: Launching, key: bytes, host: str,
                 launch: Callable[[int], None]) -> None:
    """Listen on `host` for peers holding `key`, call `launch(port)`, then take every worker
    in (WorldError, ChannelClosed or TimeoutError when the world does not form)."""
    server = ControlServer(key, host=host)
    world.listening_port = server.port
    try:
        launch(server.port)
        world.launches += 1
        accept_workers(world, server)
    finally:
        world.strangers_dropped += server.dropped
        server.close()
        world.listening_port = None


def accept_workers(world: Launching, server: ControlServer) -> None:
    """Every worker, authenticated, says hello, then that it joined the group."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S

    def launcher_alive() -> None:
        if not world.alive:
            raise WorldError(f"torchrun exited with {world._proc.returncode} before every "
                             f"worker connected:\n{world._log_tail()}")

    while len(world._channels) < world.nproc:
        try:
            channel = server.accept(deadline, launcher_alive)
        except TimeoutError:
            raise WorldError(f"only {len(world._channels)} of {world.nproc} workers "
                             f"connected within {LAUNCH_TIMEOUT_S:.0f} s") from None
        hello = channel.recv(timeout_s=30)
        rank, pid = hello[1], hello[2]
        world._channels[rank], world._pids[rank] = channel, pid
        world._hello(rank, hello[3:])
    for rank, channel in world._channels.items():
        message = channel.recv(timeout_s=max(1.0, deadline - time.monotonic()))
        if message[0] != "ready":
            raise WorldError(f"rank {rank} failed to join the process group:\n"
                             f"{message[-1]}")
