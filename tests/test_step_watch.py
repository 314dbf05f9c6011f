"""A rank whose step waits without bound says when the step outlives its deadline, once, and
never after the step ended (harness/world/torchrun/step_watch.py); the driver names the
hang at that word instead of after its own slack (harness/world/torchrun/collect.py)."""

from __future__ import annotations

import threading
import time

import pytest

from harness.timeouts import DRIVER_SLACK_S, Timeouts
from harness.world.channel.messages import StepOverdue
from harness.world.torchrun.step_watch import overdue_notice, waits_unbounded


class Recorder:
    """A channel that keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list = []
        self.lock = threading.Lock()

    def send(self, message) -> None:
        with self.lock:
            self.sent.append(message)


def test_a_step_that_outlives_its_deadline_is_said_overdue_once():
    channel = Recorder()
    with overdue_notice(channel, 1, 3, 0.05):
        time.sleep(0.4)
    assert channel.sent == [StepOverdue(1, 3, 0.05)]


def test_a_step_that_ends_in_time_is_never_said_overdue_even_later():
    channel = Recorder()
    with overdue_notice(channel, 0, 0, 0.2):
        pass
    time.sleep(0.4)  # past the deadline: the ended step's watch must stay silent
    assert channel.sent == []


def test_a_runtime_whose_waits_are_bounded_gets_no_watch():
    channel = Recorder()
    with overdue_notice(channel, 0, 0, 0.05, armed=waits_unbounded(object())):
        time.sleep(0.2)
    assert channel.sent == []


def test_vllms_execution_runtime_is_watched_and_the_harnesss_own_is_not():
    pytest.importorskip("vllm")
    from harness.sut.rank_runtime import RankRuntime
    from harness.vllm_exec.runtime import VllmExecRuntime

    assert waits_unbounded(VllmExecRuntime) and not waits_unbounded(RankRuntime)


def test_a_hang_is_proved_at_the_step_deadline_not_after_the_drivers_slack():
    t = Timeouts(collective_s=1.0, hang_s=1.5, step_deadline_s=3.0)
    # The step deadline is what liveness judges by, above every bounded wait of a step.
    assert t.overdue_s == t.step_deadline_s > t.hang_s + t.collective_s
    assert t.step_wait_s - t.overdue_s == DRIVER_SLACK_S
