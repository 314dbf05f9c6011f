"""The sandbox's processes: a zygote that imports torch once and forks a runner per sim world,
and the runner, which hosts the sim world's rank threads and streams their records back.

    python -m harness.world.sandbox.child --fd N

The zygote talks to the driver over the socket pair end it inherited as fd N; the driver
hands it the runner's end of a fresh socket pair with each fork request (SCM_RIGHTS), so
every channel is one the driver created and only its child holds: nothing listens. The
zygote itself runs no torch op and starts no thread, so forking it is safe and quick; a
runner that dies (a gloo abort, a segfault) costs a fork, not an interpreter start.

Neither outlives the driver: the zygote exits when its channel closes and kills its
runners; a runner dies with the zygote (PR_SET_PDEATHSIG) and exits when its channel closes.
A runner whose own harness code raised (no rank's failure: those are records) says so in one
typed line (RunnerCannot) and ends, so that it is never read as a crash of the ranks.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from harness.config import HarnessConfig
from harness.errors import cannot_of
from harness.scenario import scenario_from_dict
from harness.sut import systems
from harness.timeouts import Timeouts
from harness.world.channel.messages import (
    ForkRunner,
    LoadSystem,
    Message,
    ReapRunner,
    RunnerCannot,
    RunnerForked,
    RunnerHello,
    RunnerReaped,
    SimDone,
    SimRun,
    SystemLoaded,
    ZygoteReady,
)
from harness.world.channel.wire import Channel, ChannelClosed
from harness.world.processes.parent_death import die_with_parent
from harness.world.sim.world import SimWorld
from harness.world.trace_layout import TraceLayout
from harness.world.vllm_slots import register_vllm_code

FD_WAIT_S = 10.0  # the runner's fd follows its fork request at once
REAP_POLL_S = 0.01


def run_runner(fd: int, nproc: int, timeouts: Timeouts, trace_dir: Path) -> None:
    """The runner's loop: a persistent sim world fed scenarios until its channel closes."""
    # Native messages (gloo's "terminate called ... what(): ...") land where the driver reads.
    layout = TraceLayout(trace_dir)
    err = os.open(layout.runner_stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(err, 2)
    os.close(err)
    stacks = open(layout.runner_stacks, "w")  # lives as long as we do
    faulthandler.enable(file=stacks, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    channel = Channel(Connection(fd))
    world = SimWorld(nproc, timeouts, trace_dir=trace_dir, own_process=True)
    channel.send(RunnerHello(os.getpid()))
    while True:
        try:
            message = channel.recv()
        except ChannelClosed:
            return
        if not isinstance(message, SimRun):
            return
        try:
            run_one(world, layout, message, channel.send)
        except ChannelClosed:
            return
        except Exception as exc:  # ours, not a rank's: said in one line, and this runner ends
            channel.send(runner_cannot(exc, traceback.format_exc()))
            return
        channel.send(SimDone(world.retired))
        if world.retired:
            os._exit(0)  # the driver forks a fresh runner for the next scenario


def run_one(world: SimWorld, layout: TraceLayout, message: SimRun,
            send: Callable[[Message], None]) -> None:
    """One scenario on the runner's world, its records sent as they come. Whatever raises
    here is the harness's own failure: a rank's failure is a record, never a raise."""
    try:
        scenario = scenario_from_dict(message.scenario)
    except Exception as exc:
        raise cannot_of(exc, "world", "the sim world's runner could not read the scenario "
                        "it was sent") from exc
    for rank in range(world.nproc):  # each trace holds this scenario's collectives only
        layout.collectives(rank).write_text("")
    world.run(scenario, send)


def runner_cannot(exc: BaseException, traceback_text: str) -> RunnerCannot:
    """What the runner tells the driver when the harness's own code raised in it."""
    cannot = cannot_of(exc, "world", "the sim world raised in its process", traceback_text)
    return RunnerCannot(cannot.what, cannot.message, cannot.detail)


def _recv_fd(sock: socket.socket) -> int:
    ready, _, _ = select.select([sock], [], [], FD_WAIT_S)
    if not ready:
        raise TimeoutError("the runner's channel did not follow its fork request")
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        raise ChannelClosed("a fork request came without the runner's channel")
    return fds[0]


def _reap(pid: int, timeout_s: float) -> int | None:
    """The runner's exit code (negative: the signal that ended it), waited for up to
    `timeout_s`, then killed; None if it was not ours."""
    deadline = time.monotonic() + timeout_s
    killed = False
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline and not killed:
            os.kill(pid, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + timeout_s
        elif time.monotonic() >= deadline:
            return None
        time.sleep(REAP_POLL_S)


def serve_zygote(fd: int) -> None:
    register_vllm_code()  # before the freeze: every runner forked has the slots filled
    # Everything imported so far (torch included) is shared with every runner: frozen, a
    # runner's full collections neither walk it nor copy its pages (about 0.4 s each).
    gc.collect()
    gc.freeze()
    channel = Channel(Connection(fd))
    sock = socket.socket(fileno=os.dup(fd))
    me = os.getpid()
    runners: set[int] = set()
    channel.send(ZygoteReady(me))
    try:
        while True:
            try:
                message = channel.recv()
            except ChannelClosed:
                return  # the driver is gone
            if isinstance(message, ForkRunner):
                runner_fd = _recv_fd(sock)
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        die_with_parent(me, signal.SIGKILL)
                        channel.close()
                        sock.close()
                        run_runner(runner_fd, message.nproc, message.timeouts,
                                   Path(message.trace_dir))
                    except BaseException:  # never back into the zygote's loop
                        traceback.print_exc()
                        code = 1
                    finally:
                        os._exit(code)
                os.close(runner_fd)
                runners.add(pid)
                channel.send(RunnerForked(pid))
            elif isinstance(message, LoadSystem):
                # Imports only (no thread starts), so forking after them stays safe; every
                # runner forked later starts with the code loaded.
                try:
                    systems.load(HarnessConfig.from_dict(message.config))
                    gc.collect()
                    gc.freeze()
                    channel.send(SystemLoaded(None))
                except Exception:  # the driver raises it with this traceback
                    channel.send(SystemLoaded(traceback.format_exc()))
            elif isinstance(message, ReapRunner):
                runners.discard(message.pid)
                channel.send(RunnerReaped(message.pid, _reap(message.pid, message.timeout_s)))
            else:  # Exit, or nothing it knows
                return
    finally:
        for pid in runners:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(pid, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.world.sandbox.child")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    serve_zygote(args.fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
