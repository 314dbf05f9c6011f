"""What a faulted example costs an NCCL world (harness/world/torchrun/local_agent.py,
agent_launch.py, worker.py): several spares boot at once, the oldest is taken first, the
world ends without the exit grace, a rank imports at boot what torch imports at its first
failed collective, and a start-up that left the device held says so within a collective bound
(harness/sut/rank_runtime.py). All of it runs here, on stand-ins for processes and devices."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from harness.runtime.device_fence import DeviceFence
from harness.sut.rank_runtime import RankRuntime
from harness.timeouts import DEFAULT_TIMEOUTS
from harness.world.channel.links import RankLinks
from harness.world.torchrun import agent_launch, worker
from harness.world.torchrun.agent_launch import MAX_SPARES, spares_by_default
from harness.world.torchrun.local_agent import TERM_GRACE_S, LocalAgent


@pytest.mark.parametrize("cores, backend, spares", [
    (16, "nccl", MAX_SPARES), (16, "gloo", 1), (2, "nccl", 0), (2, "gloo", 0), (8, "nccl", 2)])
def test_a_gpu_host_keeps_several_nccl_spares_and_one_gloo_spare(monkeypatch, cores, backend,
                                                                  spares):
    monkeypatch.setattr(agent_launch.os, "cpu_count", lambda: cores)
    assert spares_by_default(2, backend) == spares


class _Launch:
    """A spare launch that never started a process: alive or not, noting its discard."""

    def __init__(self, alive: bool = True) -> None:
        self.alive, self.discarded = alive, False

    def discard(self) -> list[int]:
        self.discarded = True
        return []


def pool_agent(monkeypatch, spares: int) -> tuple[LocalAgent, list[_Launch]]:
    agent = LocalAgent(2, "gloo", "cpu", None, spares=spares)
    launched: list[_Launch] = []
    monkeypatch.setattr(agent, "_launch", lambda timeouts: launched.append(_Launch())
                        or launched[-1])
    return agent, launched


def test_a_failed_world_boots_every_spare_and_the_oldest_live_one_is_taken_first(monkeypatch):
    agent, launched = pool_agent(monkeypatch, spares=3)
    assert agent.end_world(RankLinks(), DEFAULT_TIMEOUTS, at_once=True) == []
    assert len(launched) == 3 and agent.spare is launched[0]
    launched[0].alive = False  # died while booting: discarded, the next one is taken
    assert agent._take_spare() is launched[1] and launched[0].discarded
    agent._boot_spares(DEFAULT_TIMEOUTS)  # as start() does once the taken one formed
    assert len(launched) == 5 and agent.spare is launched[2]  # three booting again
    assert agent.close(RankLinks()) == []
    assert all(launch.discarded for launch in launched[2:]) and agent.spare is None


def test_no_more_spares_than_the_pool_holds_are_kept(monkeypatch):
    agent, launched = pool_agent(monkeypatch, spares=10)
    agent.end_world(RankLinks(), DEFAULT_TIMEOUTS, at_once=True)
    assert agent.spares == MAX_SPARES and len(launched) == MAX_SPARES
    agent.close(RankLinks())


def seconds_to_end(backend: str, device: str) -> float:
    """End a world whose agent never acts on "exit" (a sleeping process stands in for it)."""
    agent = LocalAgent(2, backend, device, None, spares=0)
    agent._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                   start_new_session=True)
    start = time.monotonic()
    assert agent.end_world(RankLinks(), DEFAULT_TIMEOUTS, at_once=False) == []
    assert not agent.alive
    return time.monotonic() - start


def test_an_nccl_world_ends_without_the_exit_grace_a_gloo_world_gets():
    assert seconds_to_end("nccl", "cuda") < TERM_GRACE_S <= seconds_to_end("gloo", "cpu")


def test_an_nccl_rank_imports_at_boot_what_torch_imports_at_its_first_failed_collective(
        monkeypatch):
    imported: list[str] = []
    monkeypatch.setattr("importlib.import_module", imported.append)
    worker.preload_failure_imports()
    assert imported == ["torch._inductor"]


class _Event:
    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


def startup_runtime(device_done: bool) -> RankRuntime:
    """A rank runtime with nothing to capture whose device work finishes or never does."""
    runtime = RankRuntime.__new__(RankRuntime)
    runtime.rank = 1
    runtime.manager = SimpleNamespace(capture_all=lambda: None, captured={})
    runtime.table = SimpleNamespace(capture_order=lambda: ())
    runtime.runner = SimpleNamespace(has_pending_run=False, alive_threads=lambda: ())
    runtime.fence = DeviceFence(lambda: ["capture"], 0.05,
                                record=lambda stream: _Event(device_done))
    runtime.cache = SimpleNamespace(state=torch.ones(3))
    runtime._initial_state = torch.zeros(3)
    return runtime


def test_a_start_up_that_left_the_device_held_says_so_and_never_touches_it_again():
    held = startup_runtime(device_done=False)
    record = held.startup()
    assert record.error is not None and record.error.kind == "DeviceWedged"
    assert "rank 1 start-up" in record.error.message
    held.reset_state()  # a host copy behind the stuck collective would never return
    assert held.cache.state.tolist() == [1.0, 1.0, 1.0]


def test_a_start_up_whose_device_work_finished_resets_the_state_as_before():
    idle = startup_runtime(device_done=True)
    assert idle.startup().error is None
    idle.reset_state()
    assert idle.cache.state.tolist() == [0.0, 0.0, 0.0]
