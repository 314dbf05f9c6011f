"""The single-rank GPU world: DP rank 0 of a world of one, on one GPU, behind the World
protocol (harness/world/protocol.py).

The GPU machine has one GPU and NCCL refuses two ranks on one GPU, so the GPU path of the
rank code runs on a world of ONE rank. Its process group (harness/world/gpu/group.py) has two
backends, as the torchrun world's would: gloo for the DP sync and NCCL for the expert
all-to-alls on CUDA tensors. The all-to-all is a real NCCL collective of size one (a copy
through NCCL), so capture, replay, streams and threads are exercised for real; what one rank
cannot show is a peer that disagrees.

`run(scenario)` runs the rank in a thread of this process, bounded as the sim world's ranks
are; its captured graphs are kept for the next scenario of the same config. After a failed
or hung step the group is rebuilt before the next scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.config import HarnessConfig
from harness.errors import ConfigError
from harness.faults import FaultKind
from harness.history.records import StartupRecord, StepRecord
from harness.history.scenario_history import ScenarioHistory, step_failed, steps_may_run
from harness.scenario import Scenario
from harness.sut import systems
from harness.sut.executions import rank_runtime_class
from harness.sut.step_loop import run_steps
from harness.timeouts import DEFAULT_TIMEOUTS, Timeouts
from harness.world.gpu.group import RankGroup, open_cpu_group, open_cuda_group
from harness.world.sim.threads import run_bounded
from harness.world.vllm_slots import register_vllm_code


def single_rank_config(**fields: Any) -> HarnessConfig:
    """A config of ONE DP rank, microbatched if `fields` ask for it (rank 0 owns every
    expert, and the reference has one rank). HarnessConfig allows that only with its
    `single_rank_gpu_world` switch, which names this world."""
    fields = dict(fields)
    if fields.pop("dp_size", 1) != 1:
        raise ValueError("the single-rank GPU world has exactly one rank")
    return HarnessConfig.of(**fields, dp_size=1, single_rank_gpu_world=True)


class SingleRankGpuWorld:
    """Rank 0 of a world of one on `device`; `group` routes CPU tensors to gloo and CUDA
    tensors to NCCL (gloo alone on the CPU, with emulated graphs)."""

    nproc = 1

    def __init__(self, connect: Callable[[], RankGroup], device: torch.device,
                 timeouts: Timeouts, timeout_s: float) -> None:
        register_vllm_code()
        self.device = device
        self.graphs = "cuda" if device.type == "cuda" else "emulated"
        self.timeouts = timeouts
        self.timeout_s = timeout_s  # the group's own timeout, and its check's
        self.builds = 1  # groups built so far (one more after every failed scenario)
        self._connect = connect
        self._link: RankGroup | None = connect()
        self._captured: tuple[tuple[HarnessConfig, Timeouts], Any, StartupRecord | None] | None
        self._captured = None

    @property
    def rank(self) -> int:
        return 0

    @property
    def group(self):
        return self._opened().group

    @property
    def how(self) -> str:
        return self._opened().how

    def run(self, scenario: Scenario) -> ScenarioHistory:
        """The scenario's history; a failed or hung step is a record (None: still running at
        the deadline), never a raise."""
        config = scenario.config
        if config.serving.dp_size != 1:
            raise ConfigError("dp_size", f"the scenario has {config.serving.dp_size} ranks but the "
                              "single-rank GPU world has 1")
        ending = [i for i, f in enumerate(scenario.faults)
                  if f.kind in (FaultKind.KILL_RANK, FaultKind.ABORT_RANK)]
        if ending:
            raise ConfigError(f"faults[{ending[0]}].kind", "ends the process: the single-rank "
                              "GPU world's rank is this process")
        systems.load(config)  # before the rank's deadlines, not inside them
        runtime, startup = self._runtime(config)
        steps: list[tuple[StepRecord | None]] = []
        if steps_may_run((startup,)):
            runtime.reset_state()

            def one_step(i: int, requests, ranks) -> tuple[StepRecord | None]:
                faults = scenario.faults_at(i, 0)
                return (self._bounded(lambda: runtime.step(i, requests[0], ranks[0], faults),
                                      self.timeouts.step_wait_s),)

            steps = run_steps(scenario, one_step, lambda records: not step_failed(records))
        if not steps_may_run((startup,)) or (steps and step_failed(steps[-1])):
            self._rebuild()
        return ScenarioHistory(scenario, self.timeouts, (startup,), tuple(steps))

    def _runtime(self, config: HarnessConfig) -> tuple[Any, StartupRecord | None]:
        """The rank's runtime for `config` and its start-up record; captured once per config
        (one at a time: a GPU holds one config's graph pool)."""
        key = (config, self.timeouts)
        if self._captured is None or self._captured[0] != key:
            self._captured = None
            runtime = rank_runtime_class(config)(
                config, 0, self.group, device=str(self.device),
                collective_timeout_s=self.timeouts.collective_s,
                hang_timeout_s=self.timeouts.hang_s)
            startup = self._bounded(runtime.startup, self.timeouts.startup_deadline_s)
            self._captured = (key, runtime, startup)
        return self._captured[1], self._captured[2]

    def _bounded(self, fn: Callable[[], Any], deadline_s: float) -> Any:
        """fn() in a thread of its own on this world's device; None past `deadline_s`."""
        def on_device(_rank: int) -> Any:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            return fn()

        [result], _stuck = run_bounded(1, on_device, deadline_s, name="gpu-rank")
        return result

    def _opened(self) -> RankGroup:
        if self._link is None:
            raise RuntimeError("the single-rank GPU world is closed")
        return self._link

    def _rebuild(self) -> None:
        self._captured = None
        self._opened().close()
        self._link = None
        self._link = self._connect()
        self.builds += 1

    def close(self) -> list[int]:
        """Shut the communicators down; the world starts no process, so none is left."""
        self._captured = None
        if self._link is not None:
            self._link.close()
            self._link = None
        return []

    def __enter__(self) -> SingleRankGpuWorld:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_single_rank_gpu_world(timeout_s: float = 30.0, device: torch.device | str = "cuda",
                               timeouts: Timeouts = DEFAULT_TIMEOUTS) -> SingleRankGpuWorld:
    """The world on `device` (its group checked with one all-reduce and one all-to-all);
    its rank waits for its GPU after each step, so its bounds grow by the device fence."""
    if not torch.cuda.is_available():
        raise RuntimeError("the single-rank GPU world needs a CUDA device")
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return SingleRankGpuWorld(lambda: open_cuda_group(device, timeout_s), device,
                              timeouts.with_device_fence(), timeout_s)


def open_single_rank_cpu_world(timeout_s: float = 30.0,
                               timeouts: Timeouts = DEFAULT_TIMEOUTS) -> SingleRankGpuWorld:
    """The same world of one on the CPU (gloo, emulated graphs): the GPU world's code,
    debugged and tested where no GPU is."""
    return SingleRankGpuWorld(lambda: open_cpu_group(timeout_s), torch.device("cpu"),
                              timeouts, timeout_s)
