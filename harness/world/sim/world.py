"""The in-process world: N ranks as threads, each with a real gloo group, running the rank
code of `harness.sut.rank_runtime` on scenarios, handing back each scenario's history.

The world persists across scenarios, as the torchrun world does: its groups and each
config's captured graphs are reused, so a fuzzer pays the capture once per config. After a
failed or hung rank the groups are suspect (gloo closes a pair whose collective timed out),
so the world is rebuilt before the next scenario; a scenario stops at that failed step.

Run inside the sandbox process (harness/world/sandbox/world.py) it writes each rank's collective
trace to a file before every call, and lets a fault end the process, as a rank's would.
"""

from __future__ import annotations

import os
import signal
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from harness.config import Execution, HarnessConfig
from harness.errors import ConfigError, cannot_of
from harness.faults import FaultKind
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory, step_failed, steps_may_run
from harness.runtime.intra_op import one_intra_op_thread
from harness.runtime.settling_groups import SETTLING
from harness.scenario import Scenario
from harness.sut import systems
from harness.sut.rank_runtime import RankRuntime
from harness.sut.step_loop import run_steps
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.channel.messages import Message, SimStartup, SimStep
from harness.world.processes.collector import collector_paused
from harness.world.sim.threads import RankFailure, ThreadWorld
from harness.world.trace_layout import TraceLayout
from harness.world.vllm_slots import register_vllm_code

# Captured graph sets kept per world; the fuzzer's config space is small on purpose.
MAX_CACHED_CONFIGS = 32
QUIET_MARGIN_S = 1.0  # past the last bound a failed step's waits run under


def refuse_threads_for_vllm_execution(config: HarnessConfig) -> None:
    """vLLM's ubatching state is module-global: its execution code needs a process per rank."""
    if config.system.execution is Execution.VLLM:
        raise ConfigError("execution", "vllm keeps its microbatch state per process: run it "
                          "on the torchrun world (the default world routes it there)")


class SimWorld:
    """The in-process world behind the same interface as the torchrun world."""

    graphs = "emulated"  # the graph backend its ranks capture with

    def __init__(self, nproc: int, timeouts: Timeouts = DEFAULT_TIMEOUTS,
                 max_cached_configs: int = MAX_CACHED_CONFIGS,
                 trace_dir: Path | None = None, own_process: bool = False) -> None:
        """`trace_dir`: where each rank's collective trace goes (TraceLayout).
        `own_process`: this process is the world's alone (the sandbox), so a fault may end
        it; otherwise faults that end a process are refused."""
        one_intra_op_thread()  # its ranks are threads of this process, on few cores
        register_vllm_code()
        self.nproc = nproc
        self.timeouts = timeouts
        self.max_cached_configs = max_cached_configs
        self.trace_dir = trace_dir
        self.own_process = own_process
        self.retired = False  # with own_process: a failure left groups no one may tear down
        self.builds = 0  # thread worlds built so far (one more after every failure)
        self._threads: ThreadWorld | None = None
        self._runtimes: OrderedDict[HarnessConfig, tuple[list[RankRuntime],
                                                         list[StartupRecord | None]]]
        self._runtimes = OrderedDict()

    def __enter__(self) -> SimWorld:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run(self, scenario: Scenario, sink: Callable[[Message], None] | None = None
            ) -> ScenarioHistory:
        """The scenario's history; `sink` is handed SimStartup(records) and then
        SimStep(i, records) as each is known, before the next begins."""
        refuse_threads_for_vllm_execution(scenario.config)
        if scenario.config.serving.dp_size != self.nproc:
            raise ConfigError("dp_size", f"the scenario has {scenario.config.serving.dp_size} "
                              f"ranks but this world has {self.nproc}")
        ending = (FaultKind.KILL_RANK, FaultKind.ABORT_RANK)
        killed = [i for i, f in enumerate(scenario.faults) if f.kind in ending]
        if killed and not self.own_process:
            fault = scenario.faults[killed[0]].kind.value
            raise ConfigError(f"faults[{killed[0]}].kind", f"{fault} ends the process: it "
                              "needs the sandboxed sim world or the torchrun world")
        with collector_paused():
            return self._run(scenario, sink or (lambda _message: None))

    def _run(self, scenario: Scenario, sink: Callable[[Message], None]) -> ScenarioHistory:
        systems.load(scenario.config)  # before the ranks' deadlines, not inside them
        world = self._world()
        runtimes, startup = self._captured(world, scenario.config)
        sink(SimStartup(tuple(startup)))
        steps: list[tuple[StepRecord | None, ...]] = []
        healthy = steps_may_run(startup)
        if healthy:
            for runtime in runtimes:
                runtime.reset_state()

            def one_rank(i: int, requests, ranks, rank: int) -> StepRecord:
                faults = scenario.faults_at(i, rank)
                if any(f.kind is FaultKind.KILL_RANK for f in faults):
                    os.kill(os.getpid(), signal.SIGKILL)  # only with own_process (run)
                return runtimes[rank].step(i, requests[rank], ranks[rank], faults,
                                           scenario.schedule)

            def every_rank(i: int, requests, ranks) -> tuple[StepRecord | None, ...]:
                records, _ = world.run_bounded(
                    lambda rank, _g: one_rank(i, requests, ranks, rank),
                    self.timeouts.step_wait_s)
                sink(SimStep(i, tuple(records)))
                return tuple(records)

            steps = run_steps(scenario, every_rank, lambda records: not step_failed(records))
            healthy = not (steps and step_failed(steps[-1]))
        if not healthy:
            if self.own_process:
                # Tearing down gloo groups a failed step left mid-collective can block in
                # ~ProcessGroupGloo; the sandbox ends this process instead (a fork is cheap).
                self.retired = True
            else:  # the groups are kept until the step's waits have all ended
                self._discard(self.timeouts.hang_s + self.timeouts.collective_s + QUIET_MARGIN_S)
        return ScenarioHistory(scenario, self.timeouts, tuple(startup), tuple(steps))

    def close(self) -> list[int]:
        self._discard()
        return []

    def _world(self) -> ThreadWorld:
        if self._threads is None:
            self._threads = ThreadWorld(self.nproc, timeout_s=self.timeouts.collective_s)
            self._threads.__enter__()
            self.builds += 1
        return self._threads

    def _captured(self, world: ThreadWorld, config: HarnessConfig):
        """Every rank's runtime for `config`, with its start-up record; captured once."""
        if config in self._runtimes:
            self._runtimes.move_to_end(config)
            return self._runtimes[config]
        timeouts = self.timeouts
        try:
            runtimes = world.run(lambda rank, group: RankRuntime(
                config, rank, group, collective_timeout_s=timeouts.collective_s,
                hang_timeout_s=timeouts.hang_s, trace_path=self._trace_path(rank)))
        except RankFailure as exc:  # before the system under test ran: the harness's failure
            self._discard()
            rank, error = next(iter(exc.errors.items()))
            raise cannot_of(error, "world", f"rank {rank} could not build its runtime") from exc
        startup, _ = world.run_bounded(lambda rank, _g: runtimes[rank].startup(),
                                       timeouts.startup_deadline_s)
        self._runtimes[config] = (runtimes, startup)
        while len(self._runtimes) > self.max_cached_configs:
            self._runtimes.popitem(last=False)
        return runtimes, startup

    def _trace_path(self, rank: int) -> str | None:
        return (None if self.trace_dir is None
                else str(TraceLayout(self.trace_dir).collectives(rank)))

    def _discard(self, settle_s: float = 0.0) -> None:
        """Drop the runtimes and the thread world; its groups go to SETTLING for `settle_s`
        (harness/runtime/settling_groups.py)."""
        self._runtimes.clear()
        if self._threads is not None:
            SETTLING.hold(self._threads.groups, settle_s)
            self._threads.close()
            self._threads = None

