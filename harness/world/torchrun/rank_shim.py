"""What torchrun starts for each rank of a world that forks its ranks from a zygote.

    torchrun ... harness/world/torchrun/rank_shim.py <worker arguments>

Run as a script (the standard library only: importing the harness would import torch, the
cost this saves): it asks the world's zygote (harness/world/torchrun/rank_zygote.py) for a
rank process with torch and, where asked, vLLM already imported, hands it its environment
and stdout/stderr, and then stands for it: signals torchrun sends go to the rank, and the
rank's exit status becomes this process's. The rank lives only while this process does: the
zygote kills it when this end of the connection closes.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import sys
import time

# Shared with the zygote's side (rank_zygote.py), which names them too.
SOCKET_ENV = "DBO_HARNESS_ZYGOTE_SOCKET"
KEY_ENV = "DBO_HARNESS_ZYGOTE_KEY"
CONNECT_S = 60.0  # the zygote binds its socket within seconds of the driver starting it
REFUSED_S = 1.0  # between its bind and its listen
PR_SET_PDEATHSIG = 1


def _die_with_agent() -> None:
    """torchrun's agent going means this rank goes: SIGKILL from the kernel, no cooperation."""
    agent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != agent:
        os._exit(3)


NONCE_BYTES = 32
_LENGTH = struct.Struct(">I")


def send_frame(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other end closed the connection")
        data += chunk
    return data


def recv_frame(sock: socket.socket, limit: int = 1 << 20) -> dict:
    """One JSON object (never unpickled); ValueError for a frame over `limit` bytes."""
    (size,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit} allowed")
    message = json.loads(_recv_exactly(sock, size))
    if not isinstance(message, dict):
        raise ValueError("a frame that is no JSON object")
    return message


def proof(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


def _connect(path: str, key: bytes) -> socket.socket:
    """The zygote's connection, once this shim proved the key (the zygote's nonce, signed)."""
    deadline, refused_until = time.monotonic() + CONNECT_S, None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            # Not there yet: the zygote is starting. Refused: bound but not listening yet, a
            # moment; for longer, the zygote is gone (its log says why).
            if isinstance(exc, ConnectionRefusedError):
                refused_until = refused_until or time.monotonic() + REFUSED_S
                deadline = min(deadline, refused_until)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.sendall(proof(key, _recv_exactly(sock, NONCE_BYTES)))
    return sock


def main(argv: list[str]) -> int:
    _die_with_agent()
    path, key = os.environ.pop(SOCKET_ENV), bytes.fromhex(os.environ.pop(KEY_ENV))
    zygote = _connect(path, key)
    send_frame(zygote, {"shim_pid": os.getpid(), "argv": argv, "env": dict(os.environ),
                        "cwd": os.getcwd()})
    socket.send_fds(zygote, [b"F"], [sys.stdout.fileno(), sys.stderr.fileno()])
    rank_pid = recv_frame(zygote)["pid"]

    def forward(signum, _frame):
        try:
            os.kill(rank_pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, forward)
    try:
        code = recv_frame(zygote)["exit"]
    except (EOFError, OSError):
        print("rank_shim: the rank zygote went away before the rank ended", file=sys.stderr)
        return 3
    if code < 0:  # killed by a signal: end the same way, as torchrun would have seen it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
