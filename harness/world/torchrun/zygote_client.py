"""The driver's side of a rank zygote (harness/world/torchrun/rank_zygote.py): starts it,
gives each launch of the world what its rank shims need to reach it, and stops it."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.world.processes.lifecycle import package_pythonpath, wait_or_signal
from harness.world.torchrun.rank_shim import KEY_ENV, SOCKET_ENV, recv_frame, send_frame
from harness.world.torchrun.rank_zygote import SETTLE_S

STOP_S = 10.0  # the zygote kills and reaps its ranks, then exits


class RankZygote:
    def __init__(self, preload_vllm: bool) -> None:
        # mkdtemp's folder is the driver's user's alone (0700): no one else reaches the socket.
        self.folder = Path(tempfile.mkdtemp(prefix="dbo-rank-zygote-"))
        self.socket_path = self.folder / "ranks.sock"
        self._key = secrets.token_bytes(32)
        self._control, theirs = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_pythonpath(),
                   **{KEY_ENV: self._key.hex()})
        cmd = [sys.executable, "-m", "harness.world.torchrun.rank_zygote",
               "--driver-pid", str(os.getpid()), "--socket", str(self.socket_path),
               "--control-fd", str(theirs.fileno()),
               *(["--preload-vllm"] if preload_vllm else [])]
        try:
            with open(self.folder / "zygote.log", "wb") as log:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True, pass_fds=(theirs.fileno(),))
        except BaseException:
            self._control.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        finally:
            theirs.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def launch_env(self) -> dict[str, str]:
        """What a launch's agent passes its rank shims (by environment, never a command line)."""
        return {SOCKET_ENV: str(self.socket_path), KEY_ENV: self._key.hex()}

    def settle(self) -> list[int]:
        """Once every rank whose shim is gone is reaped: the pids that would not die."""
        if not self.alive:
            return []  # its ranks died with it (PR_SET_PDEATHSIG)
        try:
            self._control.settimeout(SETTLE_S + 5.0)
            send_frame(self._control, {"ask": "settle"})
            return [int(pid) for pid in recv_frame(self._control)["alive"]]
        except (OSError, EOFError, ValueError, KeyError):
            self._stop()  # a zygote that cannot answer takes its ranks with it
            return []

    def close(self) -> list[int]:
        """Stop the zygote and every rank it forked; pids still alive after (must be none)."""
        self._control.close()
        self._stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        return [self.proc.pid] if self.alive else []

    def _stop(self) -> None:
        wait_or_signal(self.proc, STOP_S, signal.SIGKILL)

    def log_tail(self) -> str:
        log = self.folder / "zygote.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""
