"""The control channel between the driver and its workers: length-prefixed pickles over a
loopback TCP socket whose port the OS picks. Both ends are this project's own processes."""

from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any

_HEADER = struct.Struct(">I")


class ChannelClosed(ConnectionError):
    """The other end went away."""


def send(sock: socket.socket, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message before the deadline")
            sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - got)
        except TimeoutError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not chunk:
            raise ChannelClosed("the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, timeout_s: float | None = None) -> Any:
    """The next message; TimeoutError past `timeout_s`, ChannelClosed when the peer is gone."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    return pickle.loads(_recv_exact(sock, size, deadline))
