"""A rank's step under a scenario's schedule (harness/runtime/schedule/step.py): the harness's
own ring replays its interleavings run after run and computes what `os` computes; `os`
records nothing and leaves the threads real; a deadlock is the step's one-line hang naming
every thread, and a run the scheduler could not control is the harness's own failure."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from harness.check.checkers import check_liveness
from harness.errors import ErrorOrigin, HarnessCannot
from harness.history.records import StepRecord
from harness.history.step_error import error_of
from harness.reference_plans import judge_run
from harness.runtime.schedule import OS_PRIMITIVES, OS_SCHEDULE, Schedule
from harness.runtime.schedule.step import (
    ScheduleCannot,
    ScheduleDeadlockError,
    recorded,
    scheduled_step,
)
from harness.scenario import scenario_from_dict
from harness.timeouts import Timeouts
from harness.world.sim.world import SimWorld

TIMEOUTS = Timeouts(collective_s=2.0, hang_s=4.0, step_deadline_s=10.0)
DATA = {"config": {"cudagraph_mode": "NONE", "max_num_reqs": 16,
                   "max_num_batched_tokens": 32, "decode_threshold": 4,
                   "prefill_threshold": 16, "num_ubatches": 3},
        "steps": [{"ranks": [{"tokens": 10}, {"tokens": 12}]},
                  {"ranks": [{"tokens": 6}, {"tokens": 9}]}]}


@pytest.fixture(scope="module")
def world():
    with SimWorld(2, TIMEOUTS) as w:
        yield w


def ran(world, schedule: Schedule):
    """(every record's choices, every record's outputs) of the scenario under `schedule`."""
    history = world.run(replace(scenario_from_dict(DATA), schedule=schedule))
    assert judge_run(history).ok
    records = [r for step in history.steps for r in step]
    assert all(r.executed == "eager-microbatched" for r in records)
    return [r.schedule_choices for r in records], [r.outputs for r in records]


@pytest.mark.parametrize("schedule", [Schedule("pct", seed=5), Schedule("random", seed=2),
                                      Schedule("exhaustive", seed=7, preemptions=1)])
def test_a_controlled_scenario_replays_the_same_choices_ten_times_of_ten(world, schedule):
    first = ran(world, schedule)
    assert all(len(c) > 5 for c in first[0])
    assert all(ran(world, schedule) == first for _ in range(9))


def test_different_seeds_interleave_differently_and_compute_what_os_computes(world):
    lists = {tuple(ran(world, Schedule("random", seed=s))[0][0]) for s in range(4)}
    assert len(lists) > 1
    assert ran(world, Schedule("pct", seed=1))[1] == ran(world, OS_SCHEDULE)[1]


def test_os_after_a_controlled_step_records_no_choice_on_threadings_own_threads(world):
    ran(world, Schedule("pct", seed=3))  # a controlled step puts the real primitives back
    runtimes, _ = world._runtimes[scenario_from_dict(DATA).config]
    assert all(rt.runner.threads.primitives is OS_PRIMITIVES for rt in runtimes)
    choices, _ = ran(world, OS_SCHEDULE)
    assert choices == [None] * 4
    last = [t for rt in runtimes for t in rt.runner.threads._last.threads]
    assert len(last) == 6 and all(type(t) is threading.Thread for t in last)


def _deadlocked_step():
    with scheduled_step(Schedule("random", seed=1), 5.0, "rank 0") as step:
        never = step.primitives.event("never")
        waiter = step.primitives.thread(lambda: never.wait(), "waiter")
        waiter.start()
        waiter.join()


def test_a_deadlock_is_the_steps_one_line_hang_naming_every_thread_and_frame():
    start = time.monotonic()
    with pytest.raises(ScheduleDeadlockError) as info:
        _deadlocked_step()
    assert time.monotonic() - start < 2.0  # found at once, no timeout waited out
    line = str(info.value)
    assert "\n" not in line and line.startswith("deadlock under schedule random seed 1: ")
    assert "thread 0 'rank 0' blocked in join waiter" in line
    assert "thread 1 'waiter' blocked in never.wait at tests/test_schedule_steps.py:" in line
    assert "(<lambda>)" in line
    error = error_of(recorded(info.value))
    assert error.origin is ErrorOrigin.HANG
    verdict = check_liveness([StepRecord.failed(0, 0, error)], 10.0)
    assert not verdict.ok and "rank 0 hung: ScheduleDeadlockError" in verdict.detail


def test_a_thread_blocking_outside_the_schedule_is_the_harness_failing_never_a_finding():
    with pytest.raises(ScheduleCannot) as info:
        with scheduled_step(Schedule("pct", seed=0), 0.2, "rank 0") as step:
            sleeper = step.primitives.thread(lambda: time.sleep(0.6), "sleeper")
            sleeper.start()
            sleeper.join()
    assert isinstance(info.value, HarnessCannot) and info.value.what == "schedule"
    assert info.value.message.startswith("stuck under schedule pct seed 0")
    with pytest.raises(ScheduleCannot):
        recorded(info.value)
    plain = RuntimeError("a microbatch failed")
    assert recorded(plain) is plain
