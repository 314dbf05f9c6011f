"""The driver's listening side of the control channel: only peers holding the world's key
get through.

The standard library's `Listener.accept()` runs the handshake inline with no bound, so one
stranger that connects and stays silent would stall it. Here each accepted connection gets
the same stdlib handshake (`deliver_challenge`, then `answer_challenge`) in a thread of its
own with a deadline; past it the socket is shut down, which ends the thread. An acceptor
thread takes connections for as long as the server is open, so strangers are handled whether
or not the driver is waiting. A connection that fails is dropped and logged in one line; the
caller only ever sees authenticated peers.
"""

from __future__ import annotations

import itertools
import os
import queue
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from harness.world.channel.wire import Channel

HANDSHAKE_TIMEOUT_S = 5.0
BACKLOG = 1024  # a flood of strangers must not fill the queue before the workers connect


@dataclass
class _Pending:
    sock: socket.socket
    peer: str
    deadline: float
    expired: bool = False


class ControlServer:
    def __init__(self, key: bytes, host: str = "127.0.0.1",
                 log: Callable[[str], None] | None = None) -> None:
        self.key = key
        self.sock = socket.create_server((host, 0), backlog=BACKLOG)  # the OS picks the port
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.dropped = 0
        self._ready: queue.Queue[Channel] = queue.Queue()
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name="control-acceptor")
        self._acceptor.start()

    def accept(self, deadline: float, check: Callable[[], None] = lambda: None) -> Channel:
        """The next peer that passed the handshake, by `deadline` (TimeoutError after it).
        `check` runs between waits and may raise (e.g. the launcher died)."""
        while True:
            check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no authenticated peer before the deadline")
            try:
                return self._ready.get(timeout=min(0.05, remaining))
            except queue.Empty:
                continue

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            self._expire(time.monotonic())
            try:
                readable, _, _ = select.select([self.sock], [], [], 0.05)
            except (OSError, ValueError):
                return  # closed under us
            if readable:
                self._accept_one()

    def _accept_one(self) -> None:
        try:
            sock, address = self.sock.accept()
        except OSError:  # nothing after all, or closed under us
            return
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = _Pending(sock, f"{address[0]}:{address[1]}",
                           time.monotonic() + HANDSHAKE_TIMEOUT_S)
        with self._lock:
            ident = next(self._ids)
            self._pending[ident] = pending
        threading.Thread(target=self._handshake, args=(ident, pending), daemon=True,
                         name="control-handshake").start()

    def _handshake(self, ident: int, pending: _Pending) -> None:
        connection = Connection(os.dup(pending.sock.fileno()))
        try:
            deliver_challenge(connection, self.key)  # the peer proves it holds the key
            answer_challenge(connection, self.key)  # and this side proves it too
        except (AuthenticationError, EOFError, OSError, ValueError) as exc:
            connection.close()
            why = (f"silent past the {HANDSHAKE_TIMEOUT_S:.0f} s bound" if pending.expired
                   else f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            self._drop(ident, pending, why)
            return
        with self._lock:
            self._pending.pop(ident, None)
        pending.sock.close()  # the connection holds its own descriptor
        if self._closed.is_set():  # nobody will take it
            connection.close()
            return
        self._ready.put(Channel(connection))

    def _drop(self, ident: int, pending: _Pending, why: str) -> None:
        with self._lock:
            self._pending.pop(ident, None)
            self.dropped += 1
        _shut(pending.sock)
        self.log(f"control channel: dropped a connection from {pending.peer} that failed the "
                 f"handshake ({why})")

    def _expire(self, now: float) -> None:
        """Shut the sockets of handshakes past their deadline: their threads then end."""
        with self._lock:
            late = [p for p in self._pending.values() if now >= p.deadline]
        for pending in late:
            pending.expired = True
            try:
                pending.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        self._acceptor.join(1.0)
        self.sock.close()
        with self._lock:
            pending = list(self._pending.values())
        for p in pending:
            _shut(p.sock)
        while True:  # authenticated peers nobody took
            try:
                self._ready.get_nowait().close()
            except queue.Empty:
                return


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
