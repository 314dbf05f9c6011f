"""Bounded waits for device collectives and device work, and the layout of NCCL ranks on
GPUs: the pieces of the NCCL world that run without a GPU, on stand-ins."""

from __future__ import annotations

import time

import pytest

from harness.errors import ConfigError
from harness.runtime.comm import CollectiveTimeout, wait_polled
from harness.runtime.device_fence import DeviceFence, DeviceWedged
from harness.timeouts import DEVICE_MARGIN_S, Timeouts
from harness.world.torchrun.backends import check_backend
from harness.world.torchrun.gpus import GpuLayout, shared_gpu_environment


class Work:
    """A collective's Work that completes after `polls` queries (never with None)."""

    def __init__(self, polls: int | None, error: Exception | None = None) -> None:
        self.polls = polls
        self.error = error
        self.queries = 0
        self.waited = False

    def is_completed(self) -> bool:
        if self.error is not None:
            raise self.error
        self.queries += 1
        return self.polls is not None and self.queries > self.polls

    def wait(self) -> bool:
        self.waited = True
        return True


def test_a_polled_collective_returns_once_done_and_orders_the_stream_after_it():
    work = Work(polls=3)
    wait_polled(work, "all_to_all", timeout_s=5.0)
    assert work.queries == 4 and work.waited


def test_a_polled_collective_whose_peer_never_comes_times_out_at_its_bound():
    work = Work(polls=None)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout, match="did not complete within 0.2 s"):
        wait_polled(work, "all_to_all of (4, 2)", timeout_s=0.2)
    # The bound is the point: not given up before it. How soon after is no correctness.
    assert time.monotonic() - start >= 0.2
    assert work.queries > 1 and not work.waited  # polled, never ordered after unfinished work


def test_a_collective_the_backend_failed_is_a_named_timeout():
    with pytest.raises(CollectiveTimeout, match="failed: NCCL communicator was aborted"):
        wait_polled(Work(0, RuntimeError("NCCL communicator was aborted\nmore")), "x", 1.0)


class Event:
    def __init__(self, done: bool) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


def test_a_fence_over_idle_streams_returns_at_once():
    recorded: list[Event] = []

    def record(stream: str) -> Event:
        recorded.append(Event(True))
        return recorded[-1]

    fence = DeviceFence(lambda: ["a", "b"], 5.0, record=record)
    fence.wait("rank 0 step 0")
    # At once: one event per stream, each asked once, no poll.
    assert [e.queries for e in recorded] == [1, 1] and fence.wedged is None


def test_a_fence_over_a_held_stream_wedges_the_device_for_good():
    fence = DeviceFence(lambda: ["free", "held"], 0.2,
                        record=lambda s: Event(s == "free"))
    with pytest.raises(DeviceWedged, match="rank 1 step 3: the GPU work did not finish"):
        fence.wait("rank 1 step 3")
    with pytest.raises(DeviceWedged):
        fence.check()  # no later step may touch the device


def test_nccl_timeouts_leave_room_for_the_device_fence_after_a_failed_collective():
    fuzz = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=3.0).with_device_fence()
    assert fuzz.hang_s >= fuzz.collective_s + DEVICE_MARGIN_S
    assert fuzz.step_deadline_s >= fuzz.hang_s + 2 * fuzz.collective_s + DEVICE_MARGIN_S
    roomy = Timeouts(5.0, 10.0, 30.0)
    assert roomy.with_device_fence() == roomy


def test_ranks_beyond_the_gpus_share_them_round_robin_and_say_so():
    shared = GpuLayout(ranks=4, gpus=1)
    assert shared.shared and shared.ranks_per_gpu == 4
    assert [shared.gpu_of(r) for r in range(4)] == [0, 0, 0, 0]
    assert "share 1 GPU(s)" in shared.describe() and "sockets" in shared.describe()
    owned = GpuLayout(ranks=2, gpus=2)
    assert not owned.shared and [owned.gpu_of(r) for r in range(2)] == [0, 1]
    assert owned.describe() == "nccl: 2 ranks, one GPU each"
    assert [GpuLayout(5, 2).gpu_of(r) for r in range(5)] == [0, 1, 0, 1, 0]


def test_each_sharing_rank_gets_an_nccl_host_identity_of_its_own():
    ids = {shared_gpu_environment(r)["NCCL_HOSTID"] for r in range(4)}
    assert len(ids) == 4
    assert shared_gpu_environment(0)["NCCL_SOCKET_IFNAME"] == "lo"
    assert shared_gpu_environment(0, "eth1")["NCCL_SOCKET_IFNAME"] == "eth1"


def test_nccl_without_a_gpu_and_nccl_on_the_cpu_are_refused_naming_the_field():
    with pytest.raises(ConfigError) as error:
        GpuLayout(ranks=2, gpus=0)
    assert error.value.field == "backend"
    with pytest.raises(ConfigError) as error:
        check_backend("nccl", 2, "cpu")
    assert error.value.field == "device"
