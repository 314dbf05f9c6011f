"""When a failed step leaves every rank alive and clean, the torchrun world forms a fresh group
in the same processes instead of relaunching; a rank that left a thread or a begun run
behind, on either side of the wire, costs a relaunch."""

from __future__ import annotations

from dataclasses import replace

from record_builders import startup_records, step_records

from harness.history.step_error import StepError
from harness.world.channel.messages import Regrouped, RegroupFailed
from harness.world.torchrun.worker import Worker
from harness.world.torchrun.world import TorchrunWorld

FAILED = StepError("InjectedFault", "injected failure in microbatch 0", None)


def failed_step(ranks: int = 2):
    records = step_records(ranks)
    return [[replace(records[0], error=FAILED), *records[1:]]]


def test_a_failure_every_rank_survived_cleanly_may_regroup_over_gloo():
    world = TorchrunWorld(2)  # nothing is launched before a run
    assert world._may_regroup(startup_records(2), failed_step())


def test_a_microbatch_thread_left_alive_on_any_rank_forbids_the_regroup():
    steps = failed_step()
    steps[0][1] = replace(steps[0][1], threads_alive=("ubatch-1",))
    assert not TorchrunWorld(2)._may_regroup(startup_records(2), steps)


def test_a_begun_run_left_at_start_up_forbids_the_regroup():
    startup = startup_records(2)
    startup[1] = replace(startup[1], pending_run=True)
    assert not TorchrunWorld(2)._may_regroup(startup, failed_step())


def test_a_rank_that_left_no_record_forbids_the_regroup():
    steps = failed_step()
    steps[0][1] = None
    assert not TorchrunWorld(2)._may_regroup(startup_records(2), steps)


def test_a_rank_whose_device_is_wedged_forbids_the_regroup():
    steps = failed_step()
    wedged = StepError("DeviceWedged", "rank 1 step 0: stream held by an all_to_all", None)
    steps[0][1] = replace(steps[0][1], error=wedged)
    assert not TorchrunWorld(2)._may_regroup(startup_records(2), steps)


def test_a_nccl_world_never_regroups_in_place():
    world = TorchrunWorld(2)
    world.backend = "nccl"  # as an NCCL world answers; asking needs no GPU
    assert not world._may_regroup(startup_records(2), failed_step())


class _Channel:
    def __init__(self) -> None:
        self.sent = []

    def send(self, message) -> None:
        self.sent.append(message)


class _Runtime:
    def __init__(self, threads=(), pending=False) -> None:
        self.threads, self.has_pending_run = threads, pending

    def alive_threads(self):
        return self.threads


def test_a_worker_holding_a_live_microbatch_thread_refuses_to_regroup_and_says_why(tmp_path):
    channel = _Channel()
    worker = Worker(1, channel, None, tmp_path)
    worker.runtimes[("config", "timeouts")] = (_Runtime(threads=("ubatch-0",)), None)
    worker.regroup(1, 1.0)
    [answer] = channel.sent
    assert isinstance(answer, RegroupFailed) and answer.rank == 1
    assert "thread ubatch-0" in answer.traceback
    assert worker.runtimes, "a refused regroup must keep what it could not clean"


def test_a_worker_with_a_begun_run_refuses_to_regroup(tmp_path):
    channel = _Channel()
    worker = Worker(0, channel, None, tmp_path)
    worker.runtimes[("config", "timeouts")] = (_Runtime(pending=True), None)
    worker.regroup(1, 1.0)
    assert isinstance(channel.sent[0], RegroupFailed)
    assert "a begun run" in channel.sent[0].traceback
    assert channel.sent[0] != Regrouped(0)
