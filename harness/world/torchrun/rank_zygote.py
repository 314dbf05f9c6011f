"""A world's rank zygote: imports torch (and vLLM, for a world that preloads it) once, then
forks a rank process for every rank shim torchrun starts (harness/world/torchrun/rank_shim.py).

    python -m harness.world.torchrun.rank_zygote --driver-pid PID --socket PATH --control-fd N
        [--preload-vllm]

On two cores a rank that imports torch and vLLM itself costs about 11 s of CPU, so a vLLM
world and its two spares about 70 s; a fork costs milliseconds. The zygote runs no torch op
and no thread of its own, so forking it is safe (CPU ranks only: a CUDA driver set up
before a fork is unusable after it, so CUDA worlds never use one).

Shims connect to a Unix socket in a folder only the driver's user can enter, and prove the
key the driver gave their agent by environment (an HMAC of the zygote's nonce) before the
zygote reads a byte of their request (JSON). Every rank is the zygote's child: it is killed
when its shim's connection closes, and dies with the zygote (PR_SET_PDEATHSIG), which dies
with the driver the same way. On "settle" the zygote answers once every rank whose shim is
gone is reaped; when the driver's end of the control socket closes it kills its ranks.
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import select
import signal
import socket
import sys
import time
import traceback

from harness.world.multinode.nodes import peer_closed
from harness.world.processes.parent_death import die_with_parent
from harness.world.torchrun.rank_shim import (
    KEY_ENV,
    NONCE_BYTES,
    proof,
    recv_frame,
    send_frame,
)

TICK_S = 0.02  # how often ranks are reaped between events
HANDSHAKE_S = 5.0  # a shim answers the nonce at once
SETTLE_S = 5.0  # a SIGKILLed rank is reaped well within this


class Zygote:
    def __init__(self, listener: socket.socket, control: socket.socket, key: bytes) -> None:
        self.listener, self.control, self.key = listener, control, key
        self.shims: dict[int, socket.socket] = {}  # rank pid -> its shim's connection
        self.pid = os.getpid()

    def serve(self) -> None:
        while True:
            watched = [self.listener, self.control, *self.shims.values()]
            readable = select.select(watched, [], [], TICK_S)[0]
            for rank_pid, shim in list(self.shims.items()):
                if shim in readable:  # a shim sends nothing after its request: it is gone
                    self._kill(rank_pid)
            if self.listener in readable:
                self._accept()
            if self.control in readable and not self._answer_driver():
                break
            self._reap()
        for rank_pid in list(self.shims):
            self._kill(rank_pid)
        self._settle()

    def _accept(self) -> None:
        shim, _ = self.listener.accept()
        try:
            shim.settimeout(HANDSHAKE_S)
            nonce = secrets.token_bytes(NONCE_BYTES)
            shim.sendall(nonce)
            answer = shim.recv(len(proof(self.key, nonce)), socket.MSG_WAITALL)
            if not hmac.compare_digest(answer, proof(self.key, nonce)):
                raise PermissionError("a connection that does not hold the key")
            request = recv_frame(shim)
            _, fds, _, _ = socket.recv_fds(shim, 1, 2)
            if len(fds) != 2:
                raise ValueError(f"{len(fds)} file descriptors where stdout and stderr go")
            shim.settimeout(None)
            rank_pid = self._fork(request, fds, shim)
        except (OSError, ValueError, EOFError) as exc:
            print(f"rank_zygote: dropped a shim: {exc}", file=sys.stderr, flush=True)
            shim.close()
            return
        self.shims[rank_pid] = shim
        try:
            send_frame(shim, {"pid": rank_pid})
        except OSError:
            self._kill(rank_pid)  # its shim is gone already

    def _fork(self, request: dict, fds: list[int], shim: socket.socket) -> int:
        try:
            rank_pid = os.fork()
            if rank_pid == 0:
                self._become_rank(request, fds, shim)
        finally:
            for fd in fds:
                os.close(fd)
        return rank_pid

    def _become_rank(self, request: dict, fds: list[int], shim: socket.socket) -> None:
        """In the forked child: the rank process torchrun asked for, never returning."""
        code = 1
        try:
            die_with_parent(self.pid, signal.SIGKILL)
            for sock in (self.listener, self.control, shim, *self.shims.values()):
                sock.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            from harness.world.torchrun import worker

            sys.argv = [worker.__file__, *request["argv"]]
            code = worker.main(request["argv"])
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code if isinstance(code, int) else 1)

    def _answer_driver(self) -> bool:
        """False when the driver is done with this zygote."""
        try:
            asked = recv_frame(self.control)
        except (EOFError, OSError, ValueError):
            return False
        if asked.get("ask") != "settle":
            return False
        send_frame(self.control, {"alive": self._settle()})
        return True

    def _settle(self) -> list[int]:
        """Reap every rank whose shim is gone; the pids still alive after SETTLE_S."""
        gone = [pid for pid, shim in self.shims.items() if peer_closed(shim.fileno())]
        for rank_pid in gone:
            self._kill(rank_pid)
        deadline = time.monotonic() + SETTLE_S
        while any(pid in self.shims for pid in gone) and time.monotonic() < deadline:
            self._reap()
            time.sleep(TICK_S)
        return [pid for pid in gone if pid in self.shims]

    def _kill(self, rank_pid: int) -> None:
        try:
            os.kill(rank_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        while self.shims:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            shim = self.shims.pop(pid, None)
            if shim is not None:
                try:
                    send_frame(shim, {"exit": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                shim.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.world.torchrun.rank_zygote")
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--preload-vllm", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent(args.driver_pid, signal.SIGKILL)
    key = bytes.fromhex(os.environ.pop(KEY_ENV))
    control = socket.socket(fileno=args.control_fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(64)
    from harness.world.torchrun import worker  # noqa: F401  torch, for every rank to share

    if args.preload_vllm:
        try:
            from harness.vllm_exec import runtime_class

            runtime_class()
        except Exception:  # each rank imports it again and names the error as it always did
            traceback.print_exc()
    Zygote(listener, control, key).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
