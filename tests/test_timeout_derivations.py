"""Every wait a world derives from the base bounds, pinned to the values it had when each
site spelled its own slack: a change to one derived wait shows here, not as a drift."""

from __future__ import annotations

import pytest

from harness.runtime.ubatching.threads import MicrobatchThreads
from harness.timeouts import (
    DEFAULT_TIMEOUTS,
    DRIVER_SLACK_S,
    Timeouts,
    gloo_init_wait_s,
    microbatch_join_wait_s,
    thread_run_wait_s,
)

BOUNDS = [DEFAULT_TIMEOUTS, Timeouts(1.0, 2.5, 12.0), Timeouts(0.3, 0.8, 2.0),
          Timeouts(5.0, 10.0, 30.0).with_device_fence()]


def test_the_driver_slack_is_five_seconds():
    assert DRIVER_SLACK_S == 5.0


@pytest.mark.parametrize("t", BOUNDS)
def test_the_driver_waits_for_a_step_five_seconds_past_its_deadline(t):
    assert t.step_wait_s == t.step_deadline_s + 5.0


@pytest.mark.parametrize("t", BOUNDS)
def test_a_batched_scenario_gets_every_step_deadline_plus_the_slack(t):
    assert t.batch_wait_s(1) == t.step_deadline_s + 5.0
    assert t.batch_wait_s(7) == 7 * t.step_deadline_s + 5.0


@pytest.mark.parametrize("t", BOUNDS)
def test_thread_ranks_get_a_collective_to_build_groups_and_two_for_a_plain_run(t):
    assert t.gloo_init_wait_s == gloo_init_wait_s(t.collective_s) == t.collective_s + 5.0
    assert t.thread_run_wait_s == thread_run_wait_s(t.collective_s) == 2 * t.collective_s + 5.0


@pytest.mark.parametrize("t", BOUNDS)
def test_the_sandbox_waits_for_the_three_bounds_of_the_world_inside_it(t):
    assert t.sandbox_startup_wait_s == t.startup_deadline_s + 3 * t.collective_s + 10.0
    assert t.sandbox_startup_wait_s == pytest.approx(
        t.gloo_init_wait_s + t.thread_run_wait_s + t.startup_deadline_s)


@pytest.mark.parametrize("hang_s", [0.5, 10.0, 31.0])
def test_microbatch_threads_join_within_a_hang_bound_plus_the_slack(hang_s):
    assert microbatch_join_wait_s(hang_s) == hang_s + 5.0
    assert MicrobatchThreads(hang_timeout_s=hang_s).join_timeout_s == hang_s + 5.0
    assert MicrobatchThreads(hang_timeout_s=hang_s, join_timeout_s=1.5).join_timeout_s == 1.5
