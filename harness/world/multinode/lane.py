"""`python -m harness.world.multinode.lane`: the two-node lane of `make test-multinode`.

Two torchrun agents on one machine, as a cluster runs them: node 1 is the node command
(`python -m harness.world.node`, no driver pid: it knows its driver by the beat alone), node 0
is the driver, pytest with `--nnodes 2 --rdzv-endpoint`, which starts its own agent. The
rendezvous is on 127.0.0.1 at a port free now; the control key is drawn fresh.

    python -m harness.world.multinode.lane --nproc 2 --seconds 240 -- -m dist tests/...

Bounded: past `--seconds` both are stopped. If either fails, the other is stopped at once;
node 1 must end, cleanly, within `--grace` of the driver (the driver's close ends its agent).
Exit: the driver's code when it failed, 1 when node 1 failed or the bound ran out, 2 on bad
input, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.world.channel.wire import CONTROL_KEY_ENV, new_control_key
from harness.world.multinode.loopback import free_loopback_port
from harness.world.processes.lifecycle import package_pythonpath, wait_or_signal

POLL_S = 0.5
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class LaneEnd:
    """How the lane ended: its exit code and the one line that says why."""

    code: int
    line: str


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.world.multinode.lane", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks on each of the two nodes")
    p.add_argument("--seconds", type=float, default=240.0, help="bound on the whole lane")
    p.add_argument("--grace", type=float, default=30.0,
                   help="how long node 1 may outlive a driver that passed")
    p.add_argument("pytest_args", nargs="*", help="after --: what the driver's pytest runs")
    return p


def node_one_command(endpoint: str, nproc: int, seconds: float) -> list[str]:
    return [sys.executable, "-m", "harness.world.node", "--nnodes", "2", "--node-rank", "1",
            "--rdzv-endpoint", endpoint, "--nproc", str(nproc), "--seconds", f"{seconds:.0f}"]


def driver_command(endpoint: str, nproc: int, pytest_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *pytest_args, "--world", "torchrun",
            "--nnodes", "2", "--nproc", str(nproc), "--rdzv-endpoint", endpoint]


def watch(driver: subprocess.Popen, node: subprocess.Popen, seconds: float,
          grace_s: float) -> LaneEnd:
    """Poll both until the lane has an outcome; the caller stops whatever still runs."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        driven, noded = driver.poll(), node.poll()
        if driven is not None and driven != 0:
            return LaneEnd(driven, f"the driver (pytest, node 0) exited {driven}")
        if driven == 0:
            return _node_after_driver(node, grace_s)
        if noded is not None and noded != 0:
            return LaneEnd(1, f"node 1 exited {noded} before the driver ended")
        time.sleep(POLL_S)
    return LaneEnd(1, f"the lane ran past {seconds:.0f} s: both nodes stopped")


def _node_after_driver(node: subprocess.Popen, grace_s: float) -> LaneEnd:
    try:
        code = node.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return LaneEnd(1, f"node 1 still ran {grace_s:.0f} s after the driver passed")
    if code != 0:
        return LaneEnd(1, f"node 1 exited {code} after the driver passed")
    return LaneEnd(0, "the driver passed and node 1 ended cleanly")


def stop(proc: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    """`first` to the process's session (the node command stops its agent on SIGTERM;
    pytest reports the tests run so far on SIGINT), then SIGKILL past the grace."""
    wait_or_signal(proc, 0.0, first)
    wait_or_signal(proc, STOP_GRACE_S, signal.SIGKILL)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def run_lane(nproc: int, seconds: float, grace_s: float, pytest_args: list[str]) -> LaneEnd:
    endpoint = f"127.0.0.1:{free_loopback_port()}"
    env = dict(os.environ, PYTHONPATH=package_pythonpath(),
               **{CONTROL_KEY_ENV: new_control_key().hex()})
    log = Path(tempfile.mkstemp(prefix="dbo-lane-node1-", suffix=".log")[1])
    print(f"two-node lane: rendezvous {endpoint}, {nproc} rank(s) per node, bound "
          f"{seconds:.0f} s; node 1's log: {log}", flush=True)
    with log.open("wb") as out:
        node = subprocess.Popen(node_one_command(endpoint, nproc, seconds), env=env,
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    driver = subprocess.Popen(driver_command(endpoint, nproc, pytest_args), env=env,
                              stdin=subprocess.DEVNULL, start_new_session=True)

    def stop_both() -> None:
        stop(driver, signal.SIGINT)
        stop(node)

    def on_signal(signum, _frame) -> None:
        stop_both()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        end = watch(driver, node, seconds, grace_s)
    finally:
        stop_both()
    if end.code != 0:  # the log stays, for the whole story
        print(f"--- the last lines of node 1's log ({log}) ---\n{tail(log)}", file=sys.stderr)
    else:
        log.unlink(missing_ok=True)
    return end


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    for field, value in (("nproc", args.nproc), ("seconds", args.seconds),
                         ("grace", args.grace)):
        if value <= 0:
            print(f"error: {field}: must be positive, got {value}", file=sys.stderr)
            return 2
    end = run_lane(args.nproc, args.seconds, args.grace, args.pytest_args)
    print(f"two-node lane: {'passed' if end.code == 0 else 'FAILED'}: {end.line}",
          file=sys.stderr if end.code else sys.stdout, flush=True)
    return end.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
