"""torchrun's agent, tied to the driver that started it.

    python -m harness.world.torchrun.agent_guard --driver-pid PID -- <torchrun arguments>

The agent runs in a session of its own, so a driver killed outright (SIGKILL, or SIGTERM
before it could stop its world) would leave it and its ranks behind. Here the agent gets
SIGTERM when the driver dies, which torchrun answers by stopping its workers; each worker in
turn dies with the agent (harness/world/processes/parent_death.py). Same interpreter, no
extra start.
"""

from __future__ import annotations

import argparse
import runpy
import signal
import sys

from harness.world.processes.parent_death import die_with_parent


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="harness.world.torchrun.agent_guard")
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("torchrun_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.torchrun_args[1:] if args.torchrun_args[:1] == ["--"] else args.torchrun_args
    die_with_parent(args.driver_pid, signal.SIGTERM)
    sys.argv = ["torchrun", *rest]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
