"""`python -m harness.world.node`: one node of a multi-node world. It starts this node's
torchrun agent on the c10d rendezvous and watches it.

    DBO_HARNESS_CONTROL_KEY=<hex> python -m harness.world.node --nnodes 2 --node-rank 1 \\
        --rdzv-endpoint HOST:PORT --nproc 2

The agent ends when the driver ends the world (its workers exit cleanly), or when the
rendezvous goes away; once the driver has marked its world ended, the node exits 0 either
way. It is stopped when its driver is gone (harness/world/multinode/heartbeat.py: the
driver's pid on the same host, else its beat in the rendezvous store) and past `--seconds`.
On SIGTERM or SIGINT the agent's whole session is stopped, so nothing of this node outlives
the command. The driver starts its own node's agent through this command too.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from harness.errors import ConfigError
from harness.world.channel.wire import CONTROL_KEY_ENV
from harness.world.multinode.heartbeat import (
    FIRST_BEAT_S,
    SILENCE_S,
    DriverWatch,
    store_answers,
)
from harness.world.multinode.nodes import (
    NodeSpec,
    agent_command,
    hosts_rendezvous,
    node_spec,
    shared_control_key,
)
from harness.world.processes.lifecycle import package_pythonpath, wait_or_signal

DEFAULT_SECONDS = 3600.0
STOP_GRACE_S = 10.0
WATCH_PERIOD_S = 0.5
ENDED_GRACE_S = 20.0  # past the driver's own wait for its agent (EXIT_GRACE_S, world.py)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.world.node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--rdzv-endpoint", required=True, metavar="HOST:PORT")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this node")
    p.add_argument("--backend", choices=["gloo"], default="gloo")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--trace-dir", help="where its ranks leave stacks and traces (default: "
                   "a new temporary directory, removed when the node exits)")
    p.add_argument("--driver-pid", type=int, help="the driver, when it runs on this host")
    p.add_argument("--driver-silence", type=float, default=SILENCE_S, metavar="S",
                   help=f"stop the agent when the driver's beat stands still this long "
                   f"(default {SILENCE_S:.0f}; before the first beat {FIRST_BEAT_S:.0f})")
    p.add_argument("--collective-timeout", type=float, default=5.0, metavar="S")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                   help=f"stop the agent after this (default {DEFAULT_SECONDS:.0f})")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        spec = node_spec(args.nnodes, args.node_rank, args.rdzv_endpoint)
        if args.nproc < 1:
            raise ConfigError("nproc", f"must be at least 1, got {args.nproc}")
        if args.seconds <= 0:
            raise ConfigError("seconds", f"must be positive, got {args.seconds}")
        if args.driver_silence <= 0:
            raise ConfigError("driver_silence", f"must be positive, got {args.driver_silence}")
        key = shared_control_key()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # torchrun's agent gives up on a store it cannot reach in 60 s: a node started before
    # the node that hosts it waits here instead, as long as torchrun's join would.
    bound = min(FIRST_BEAT_S, args.seconds)
    if not hosts_rendezvous(spec) and not _rendezvous_up(spec, bound):
        print(f"node {args.node_rank}: no rendezvous store at {spec.endpoint} within "
              f"{bound:.0f} s (the node that hosts it never started)", file=sys.stderr)
        return 3
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix=f"dbo-node{args.node_rank}-")
    if args.trace_dir is None:  # the driver reads the ranks' stacks while the world lives
        atexit.register(shutil.rmtree, trace_dir, ignore_errors=True)
    worker_args = ["--trace-dir", trace_dir, "--backend", args.backend, "--device", args.device,
                   "--collective-timeout", str(args.collective_timeout)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_pythonpath(),
               **{CONTROL_KEY_ENV: key.hex()})
    agent = subprocess.Popen(agent_command(sys.executable, spec, args.nproc, worker_args),
                             env=env, stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(*_) -> None:
        _stop_agent(agent)
        _kill_session(agent.pid)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watch = DriverWatch(spec.rdzv_host, spec.rdzv_port, args.driver_pid, args.driver_silence)
    code = _supervise(agent, watch, args, stop)
    _kill_session(agent.pid)  # workers the agent left behind, if any
    if node_exit(code, watch.ended) != code:
        print(f"node {args.node_rank}: its driver ended the world (the agent exited {code} "
              "as the rendezvous closed)", file=sys.stderr, flush=True)
    return node_exit(code, watch.ended)


def node_exit(agent_code: int, driver_ended: bool) -> int:
    """The node's exit code: 0 however its agent ended once the driver has ended the world
    (the rendezvous goes with the driver's node, which torchrun's agent calls a failure)."""
    return 0 if driver_ended else agent_code


def _supervise(agent: subprocess.Popen, watch: DriverWatch, args, stop) -> int:
    """The agent's exit code. It is stopped when its driver is gone or past `--seconds`;
    once the driver has ended the world, quietly, when either holds or past ENDED_GRACE_S."""
    deadline = time.monotonic() + args.seconds
    ended_at = None
    while (code := agent.poll()) is None:
        now = time.monotonic()
        why = watch.gone() or (f"the agent ran past {args.seconds:.0f} s"
                               if now > deadline else None)
        ended_at = (ended_at or now) if watch.ended else None
        if ended_at is not None:
            if why or now - ended_at > ENDED_GRACE_S:
                _stop_agent(agent)
                continue
        elif why:
            print(f"node {args.node_rank}: {why}; its agent is stopped", file=sys.stderr,
                  flush=True)
            stop()
        time.sleep(WATCH_PERIOD_S)
    return code


def _rendezvous_up(spec: NodeSpec, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while not store_answers(spec.rdzv_host, spec.rdzv_port):
        if time.monotonic() > deadline:
            return False
        time.sleep(WATCH_PERIOD_S)
    return True


def _stop_agent(agent: subprocess.Popen) -> None:
    wait_or_signal(agent, 0.0, signal.SIGTERM)
    wait_or_signal(agent, STOP_GRACE_S, signal.SIGKILL)


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
