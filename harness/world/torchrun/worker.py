"""A torchrun worker: one DP rank that lives across many scenarios, fed by the driver.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m harness.world.torchrun.worker --control 127.0.0.1:PORT --driver-pid PID --trace-dir DIR

It connects back to the driver, says hello (rank, pid), joins the process group, then runs
every scenario it is sent, streaming its records back. It exits by itself when the driver
or torchrun goes away, and dumps every thread's stack to its stacks file in DIR
(harness/world/trace_layout.py) on SIGUSR1 and on a fatal signal.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from harness.errors import cannot_of
from harness.faults import FaultKind
from harness.scenario import Scenario, scenario_from_dict
from harness.sut.executions import rank_runtime_class
from harness.sut.rank_runtime import RankRuntime
from harness.sut.step_loop import run_steps
from harness.timeouts import Timeouts
from harness.world.channel import wire
from harness.world.channel.messages import (
    AgentLost,
    BatchRan,
    Exit,
    NextStep,
    Regroup,
    Regrouped,
    RegroupFailed,
    RunBatch,
    RunScenario,
    ScenarioDone,
    StartSteps,
    StartupReport,
    StepReport,
    WorkerCannot,
    WorkerHello,
    WorkerReady,
)
from harness.world.multinode.nodes import driver_address, peer_closed, worker_node, world_group_args
from harness.world.processes.collector import collector_paused
from harness.world.processes.lifecycle import pid_alive
from harness.world.processes.parent_death import die_with_parent
from harness.world.sim.threads import new_gloo_group
from harness.world.torchrun.gpus import GpuLayout, shared_gpu_environment, visible_gpus
from harness.world.torchrun.step_watch import overdue_notice, waits_unbounded
from harness.world.trace_layout import TraceLayout
from harness.world.vllm_slots import register_vllm_code

WATCHDOG_PERIOD_S = 0.5
ARRIVAL_TIMEOUT_S = 60.0


def _watch_parents(driver_pid: int | None, channel: wire.Channel | None = None) -> None:
    """Exit at once when the driver or the torchrun agent is gone: never an orphan. A driver
    on another node is watched through its control connection instead of its pid."""
    agent = os.getppid()
    while True:
        if os.getppid() != agent and channel is not None:
            # This node's agent died: say so before going, so the driver names the node.
            with contextlib.suppress(wire.ChannelClosed):
                channel.send(AgentLost(int(os.environ["RANK"]), agent))
            os._exit(3)
        if os.getppid() != agent or (driver_pid is not None and not pid_alive(driver_pid)):
            os._exit(3)
        if channel is not None and peer_closed(channel.fileno()):
            os._exit(3)
        time.sleep(WATCHDOG_PERIOD_S)


def wait_for_every_rank(world_size: int, name: str = "harness-arrived") -> None:
    """Every rank arrives before any connects: gloo waits for its peers' addresses only as
    long as the collective timeout, which the fuzzer sets to a second, while workers finish
    importing torch seconds apart on a loaded machine."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size, is_master=False,
                          timeout=timedelta(seconds=ARRIVAL_TIMEOUT_S))
    store.add(name, 1)
    deadline = time.monotonic() + ARRIVAL_TIMEOUT_S
    while store.add(name, 0) < world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank arrived within {ARRIVAL_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def fresh_group(generation: int, timeout_s: float):
    """A new gloo group of the same ranks over torchrun's store, under its own prefix."""
    size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                          is_master=False, timeout=timedelta(seconds=ARRIVAL_TIMEOUT_S))
    prefixed = dist.PrefixStore(f"harness-regroup-{generation}/", store)
    return new_gloo_group(prefixed, int(os.environ["RANK"]), size, timeout_s)


def join_group(backend: str, device_type: str, timeout_s: float,
               group_args: dict | None = None) -> str:
    """Join the world's group; the device this rank's tensors live on.

    With nccl the DP sync's CPU matrix goes over gloo and the expert all-to-alls (captured
    into real CUDA graphs) over NCCL, on one group. Each rank owns GPU LOCAL_RANK when there
    are enough GPUs; otherwise the ranks share them round-robin, each with its own NCCL host
    identity (harness/world/torchrun/gpus.py). With gloo on CUDA the ranks share the visible GPUs
    round-robin too (gloo needs no identity). `group_args`: a store of this world's own
    (multi-node, harness/world/multinode/nodes.py).
    """
    import torch

    timeout = timedelta(seconds=timeout_s)
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend != "nccl":
        dist.init_process_group(backend, timeout=timeout, **(group_args or {}))
        if device_type == "cpu":
            return "cpu"
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return f"cuda:{index}"
    layout = GpuLayout(int(os.environ["LOCAL_WORLD_SIZE"]), visible_gpus())
    if layout.shared:
        # Read by NCCL when the communicator starts; the identity must differ per rank.
        os.environ.update(shared_gpu_environment(int(os.environ["RANK"]),
                                                 os.environ.get("NCCL_SOCKET_IFNAME")))
    device = torch.device("cuda", layout.gpu_of(local_rank))
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timeout, device_id=device,
                            **(group_args or {}))
    # NCCL connects ranks at the first collective of each kind (pairs for the all-to-all, a
    # ring for the gather), and the call that issues it blocks until the peer makes it too:
    # connect them now, while every rank is here, not in a step a peer may skip (measured:
    # an unbounded hang in the issuing thread, the all-to-all's and, H100, the ids gather's).
    size = dist.get_world_size()
    dist.all_to_all_single(torch.empty(size, device=device), torch.zeros(size, device=device))
    dist.all_gather_into_tensor(torch.empty(size, device=device), torch.zeros(1, device=device))
    dist.all_reduce(torch.zeros(1, device=device))
    torch.cuda.synchronize(device)
    preload_failure_imports()
    return str(device)


# At an NCCL rank's first failed collective a thread of torch's own imports these (dynamo and
# sympy with them): seconds under the GIL mid-step, which stalled the rank's microbatch threads
# past their bound (H100, 2 ranks sharing it: 8-9 s steps). Imported while the rank boots.
NCCL_FAILURE_IMPORTS = ("torch._inductor",)


def preload_failure_imports() -> None:
    import importlib

    for name in NCCL_FAILURE_IMPORTS:
        importlib.import_module(name)


class Worker:
    def __init__(self, rank: int, channel: wire.Channel, group, trace_dir: Path,
                 device: str = "cpu", emulated_graphs: bool = False) -> None:
        self.rank = rank
        self.channel = channel
        self.group = group
        self.trace_dir = trace_dir
        self.device = device
        self.emulated_graphs = emulated_graphs
        self.runtimes: dict[tuple, tuple[RankRuntime, object]] = {}

    def serve(self) -> bool:
        """Run what the driver sends; True when it said exit, False when it went away."""
        while True:
            try:
                message = self.channel.recv()
            except wire.ChannelClosed:
                return False
            match message:
                case Exit():
                    return True
                case RunScenario(scenario, timeouts):
                    with collector_paused():
                        self.run(scenario, timeouts)
                case Regroup(generation, timeout_s):
                    self.regroup(generation, timeout_s)
                case RunBatch(scenarios, timeouts):
                    with collector_paused():
                        for scenario_data in scenarios:
                            self.run_unattended(scenario_data, timeouts)

    def regroup(self, generation: int, timeout_s: float) -> None:
        """Leave the group a failed step broke for a fresh one (harness/world/torchrun/world.py,
        `_regroup`); everything built over the old group goes with it. A rank that still
        holds a microbatch thread or a begun run refuses: only a relaunch makes it clean."""
        leftovers = self.leftovers()
        if leftovers:
            self.channel.send(RegroupFailed(self.rank, f"not clean: {leftovers}"))
            return
        try:
            self.group = fresh_group(generation, timeout_s)
            self.runtimes.clear()
            self.channel.send(Regrouped(self.rank))
        except Exception:  # the driver relaunches the world instead
            self.channel.send(RegroupFailed(self.rank, traceback.format_exc()))

    def leftovers(self) -> list[str]:
        """What the runtimes of this rank left running: thread names, begun runs."""
        found = []
        for runtime, _ in self.runtimes.values():
            found += [f"thread {name}" for name in runtime.alive_threads()]
            if runtime.has_pending_run:
                found.append("a begun run")
        return found

    def _runtime(self, config, timeouts: Timeouts):
        key = (config, timeouts)
        if key not in self.runtimes:
            try:
                runtime = rank_runtime_class(config)(
                    config, self.rank, self.group, device=self.device,
                    emulated_graphs=self.emulated_graphs,
                    collective_timeout_s=timeouts.collective_s,
                    hang_timeout_s=timeouts.hang_s,
                    trace_path=str(TraceLayout(self.trace_dir).collectives(self.rank)))
            except Exception as exc:  # before the system under test ran: the harness's failure
                raise cannot_of(exc, "world", f"rank {self.rank} could not build its "
                                "runtime") from exc
            self.runtimes[key] = (runtime, runtime.startup())
        return self.runtimes[key]

    def _scenario(self, scenario_data: dict) -> Scenario:
        try:
            return scenario_from_dict(scenario_data)
        except Exception as exc:
            raise cannot_of(exc, "world", f"rank {self.rank} could not read the scenario it "
                            "was sent") from exc

    def run(self, scenario_data: dict, timeouts: Timeouts) -> None:
        scenario = self._scenario(scenario_data)
        runtime, startup = self._runtime(scenario.config, timeouts)
        runtime.reset_state()
        self.channel.send(StartupReport(startup))
        # The driver says whether every rank's capture went well enough to run the steps.
        if self.channel.recv() == StartSteps(True):

            def this_rank(i: int, requests, ranks) -> None:
                faults = scenario.faults_at(i, self.rank)
                if any(f.kind is FaultKind.KILL_RANK for f in faults):
                    os.kill(os.getpid(), signal.SIGKILL)
                with overdue_notice(self.channel, self.rank, i, timeouts.overdue_s,
                                    waits_unbounded(runtime)):
                    record = runtime.step(i, requests[self.rank], ranks[self.rank], faults,
                                          scenario.schedule)
                self.channel.send(StepReport(i, record))

            # Every rank stops after a step in which any rank failed, as in the sim world:
            # a rank that went on alone would wait in the next sync for nobody.
            run_steps(scenario, this_rank, lambda _: self.channel.recv() == NextStep(True))
        self.channel.send(ScenarioDone())

    def run_unattended(self, scenario_data: dict, timeouts: Timeouts) -> None:
        """A scenario of a batch (harness/world/torchrun/batches.py): fault-free, of a config this
        world captured cleanly, so no go-ahead is waited for; the rank stops after a step
        of its own that failed, and sends every record in one message."""
        scenario = self._scenario(scenario_data)
        runtime, _ = self._runtime(scenario.config, timeouts)
        runtime.reset_state()
        records = run_steps(
            scenario, lambda i, requests, ranks: runtime.step(i, requests[self.rank],
                                                              ranks[self.rank], (),
                                                              scenario.schedule),
            lambda record: record.error is None)
        self.channel.send(BatchRan(tuple(records)))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="harness.world.torchrun.worker")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--control", help="the driver's HOST:PORT")
    where.add_argument("--control-store", metavar="HOST:PORT",
                       help="multi-node: the rendezvous store where the driver publishes it")
    parser.add_argument("--driver-pid", type=int, help="the driver, on this node")
    parser.add_argument("--trace-dir", required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--collective-timeout", type=float, default=5.0)
    parser.add_argument("--preload-vllm", action="store_true",
                        help="import vLLM's execution code before saying ready")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    register_vllm_code()  # this rank may run vLLM's decision or execution code

    if args.driver_pid is not None:
        # The agent's death must end this rank even while it spins in a CUDA wait holding
        # the GIL, where the watchdog thread below can never run.
        die_with_parent(os.getppid(), signal.SIGKILL)
    rank = int(os.environ["RANK"])
    trace_dir = Path(args.trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    stacks = open(TraceLayout(trace_dir).stacks(rank), "w")  # lives as long as we do
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # A fatal signal (an abort in a native library, a segfault) leaves its name and the
    # stacks there too, for the driver to name how the rank died.
    faulthandler.enable(file=stacks, all_threads=True)

    arrival, group_args = "harness-arrived", None
    if args.control_store is not None:
        address = driver_address(args.control_store, ARRIVAL_TIMEOUT_S)
        arrival = f"harness-arrived-{address.launch}"  # one count per world the driver builds
        host, port = address.host, address.port
        group_args = world_group_args(address.launch, ARRIVAL_TIMEOUT_S)
    else:
        host, port = args.control.rsplit(":", 1)
    channel = wire.connect(host, int(port), wire.key_from_environment())
    threading.Thread(target=_watch_parents, daemon=True, name="parent-watchdog",
                     args=(args.driver_pid, channel if args.driver_pid is None else None)
                     ).start()
    channel.send(WorkerHello(rank, os.getpid(), worker_node(trace_dir)))
    try:
        wait_for_every_rank(int(os.environ["WORLD_SIZE"]), arrival)
        device = join_group(args.backend, args.device, args.collective_timeout, group_args)
        group = dist.group.WORLD
        if args.preload_vllm:
            from harness.vllm_exec import runtime_class

            runtime_class()  # vLLM's imports, outside the deadlines
        channel.send(WorkerReady(rank))
        # Gloo's collectives on CUDA tensors sync with the host, so they cannot be captured
        # into a real graph: that world emulates its graphs over the CUDA tensors.
        told_to_exit = Worker(rank, channel, group, trace_dir, device,
                              emulated_graphs=args.backend != "nccl").serve()
    except Exception as exc:  # the harness's own code (a rank's failure is a record): exit 3
        cannot = cannot_of(exc, "world", f"rank {rank}'s worker raised", traceback.format_exc())
        try:
            channel.send(WorkerCannot(rank, cannot.what, cannot.message, cannot.detail))
        except wire.ChannelClosed:
            pass
        return 1
    finally:
        channel.close()
    # Without destroying the group: peers may already be gone. A world ended without "exit"
    # leaves a failed worker, which a multi-node agent restarts for the next world.
    os._exit(0 if told_to_exit else 3)


if __name__ == "__main__":
    sys.exit(main())
