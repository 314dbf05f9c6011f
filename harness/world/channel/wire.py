"""The control channel between the driver and its workers: the standard library's
authenticated connections (`multiprocessing.connection`) over loopback TCP.

Each world draws a fresh secret; the driver hands it to the processes it starts through
their environment (`CONTROL_KEY_ENV`, never a command line or a log). Both ends prove they
hold it with an HMAC challenge before a single message is read, so nothing a stranger sends
is ever read. Messages are the typed ones of harness/world/channel/messages.py, sent as JSON
(nothing a peer sends is unpickled), read with a bound.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from multiprocessing.connection import Client, Connection

from harness.world.channel.messages import M, Message, ProtocolError, from_wire, to_wire

CONTROL_KEY_ENV = "DBO_HARNESS_CONTROL_KEY"


class ChannelClosed(ConnectionError):
    """The other end went away."""


class Channel:
    """An authenticated connection: `send` a message, `recv` the next within a bound."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._sending = threading.Lock()  # a worker's watchdog may send its last word too

    def send(self, message: Message) -> None:
        data = to_wire(message)
        try:
            with self._sending:
                self.connection.send_bytes(data)
        except (OSError, ValueError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def recv(self, timeout_s: float | None = None) -> Message:
        """The next message; TimeoutError past `timeout_s`, ChannelClosed when the peer is
        gone, ProtocolError when what it sent is no message. Only an authenticated peer can
        have sent it."""
        try:
            ready = timeout_s is None or self.connection.poll(max(0.0, timeout_s))
            data = self.connection.recv_bytes() if ready else None
        except (EOFError, OSError, ValueError) as exc:
            raise ChannelClosed(str(exc) or "the other end closed the channel") from exc
        if data is None:
            # Raised outside the handler: TimeoutError is an OSError, and a peer that is slow
            # is not a peer that is gone.
            raise TimeoutError("no message before the deadline")
        return from_wire(data)  # outside it too: a ProtocolError is a ValueError

    def fileno(self) -> int:
        return self.connection.fileno()

    def close(self) -> None:
        self.connection.close()


def expect_hello(channel: Channel, kind: type[M], timeout_s: float) -> M:
    """The first message of a connection: a hello of `kind` and of this protocol version
    (else ProtocolError, in one line, and the channel is closed)."""
    try:
        hello = channel.recv(timeout_s=timeout_s)
        if not isinstance(hello, kind):
            raise ProtocolError("message", f"the first must be {kind.__name__}, not "
                                f"{type(hello).__name__}")
    except ProtocolError:
        channel.close()
        raise
    return hello


def new_control_key() -> bytes:
    return secrets.token_bytes(32)


def key_from_environment() -> bytes:
    """The world's secret, taken out of the environment so no child process inherits it."""
    value = os.environ.pop(CONTROL_KEY_ENV, None)
    if not value:
        raise RuntimeError(f"{CONTROL_KEY_ENV} is not set: a worker is started by its driver")
    return bytes.fromhex(value)


def connect(host: str, port: int, key: bytes) -> Channel:
    """A worker's side: connect, then answer the driver's challenge and challenge it back."""
    connection = Client((host, port), family="AF_INET", authkey=key)
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()
    return Channel(connection)
