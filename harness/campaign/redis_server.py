"""A throwaway Redis server on loopback for one campaign: a free port picked at run time, no
persistence, stopped (and waited for) at the end.

Debian's `redis-server` runs it; where it is missing, `RedisUnavailable` says so in one line.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError

START_TIMEOUT_S = 10.0  # bound on the server answering PING
STOP_TIMEOUT_S = 10.0
ATTEMPTS = 3  # another process may take the picked port between the pick and the bind


class RedisUnavailable(ConfigError):
    def __init__(self, message: str) -> None:
        super().__init__("redis", message)


@dataclass(frozen=True)
class RedisEndpoint:
    host: str
    port: int

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    # The protocol's inline PING, so that waiting for the server needs no client package.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class LocalRedis:
    """`with LocalRedis() as endpoint:` a server on 127.0.0.1 for the block's duration."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self.endpoint: RedisEndpoint | None = None

    def __enter__(self) -> RedisEndpoint:
        binary = redis_server_binary()
        if binary is None:
            raise RedisUnavailable("redis-server is not installed here (Debian: apt-get "
                                   "install redis-server; `make fuzz-campaign` does it)")
        self._dir = tempfile.TemporaryDirectory(prefix="harness-redis-")
        for _ in range(ATTEMPTS):
            port = free_loopback_port()
            if self._start(binary, port):
                self.endpoint = RedisEndpoint("127.0.0.1", port)
                return self.endpoint
        tail = self._log_tail()
        self.__exit__(None, None, None)
        raise RedisUnavailable(f"redis-server did not start in {ATTEMPTS} attempts: {tail}")

    def _start(self, binary: str, port: int) -> bool:
        assert self._dir is not None
        log = Path(self._dir.name) / "redis.log"
        # Loopback only, nothing written to disk, protected mode on.
        self._proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir.name, "--logfile", str(log),
             "--daemonize", "no", "--protected-mode", "yes"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False  # e.g. the port was taken meanwhile
            if _answers_ping(port):
                return True
            time.sleep(0.05)
        self._stop()
        return False

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        log = Path(self._dir.name) / "redis.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return lines[-1].strip() if lines else "no log"

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __exit__(self, *exc) -> None:
        self._stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
