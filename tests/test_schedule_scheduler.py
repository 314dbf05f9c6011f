"""The controlled scheduler and its primitives (docs/schedules.md): one thread at a time,
virtual timeouts, deadlocks reported at once with every thread's wait and stack, and runs it
cannot control halted within the safety bound instead of hanging."""

from __future__ import annotations

import threading
import time

import pytest

from harness.errors import HarnessCannot
from harness.runtime.schedule import (
    OS_PRIMITIVES,
    Schedule,
    ScheduleDeadlock,
    ScheduledRun,
    ScheduleMisuse,
    run_once,
)

RANDOM = Schedule("random", seed=1)


def test_the_os_schedule_hands_out_threadings_own_primitives_and_records_nothing():
    with ScheduledRun(Schedule()) as run:
        assert run.primitives is OS_PRIMITIVES
        assert isinstance(run.primitives.event("e"), threading.Event)
    assert run.trace is None


@pytest.mark.parametrize("seed", range(5))
def test_only_one_controlled_thread_runs_at_a_time(seed):
    inside = [0]
    peak = [0]

    def body(p):
        for i in range(5):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            time.sleep(0.001)  # the OS would switch here; the schedule does not
            inside[0] -= 1
            p.point(f"step {i}")

    with ScheduledRun(Schedule("random", seed=seed)) as run:
        p = run.primitives
        threads = [p.thread(body, f"t{i}", (p,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert peak[0] == 1
    assert len(run.trace.decisions) > 3


def test_a_timed_wait_does_not_expire_while_another_thread_can_still_run():
    with ScheduledRun(RANDOM) as run:
        p = run.primitives
        event = p.event("e")
        got: list[bool] = []
        waiter = p.thread(lambda: got.append(event.wait(timeout=0.5)), "waiter")
        waiter.start()

        def setter():
            for i in range(20):
                p.point(f"busy {i}")
            event.set()

        p.thread(setter, "setter").start()
    assert got == [True]
    assert run.trace.clock == 0.0


def test_when_nothing_can_run_the_earliest_timeout_expires_first_and_the_clock_jumps():
    order: list[tuple[str, bool, float]] = []
    with ScheduledRun(RANDOM) as run:
        p = run.primitives
        for name, timeout in (("late", 2.0), ("early", 0.5)):
            event = p.event(name)
            p.thread(lambda n=name, e=event, s=timeout: order.append(
                (n, e.wait(timeout=s), p.monotonic())), name).start()
    assert order == [("early", False, 0.5), ("late", False, 2.0)]
    assert run.trace.clock == 2.0


def test_a_barrier_wait_that_times_out_breaks_the_barrier_for_every_waiter():
    errors: list[str] = []
    with ScheduledRun(RANDOM) as run:
        p = run.primitives
        barrier = p.barrier(3, "ready")

        def arrive(timeout):
            try:
                barrier.wait(timeout)
            except threading.BrokenBarrierError:
                errors.append(threading.current_thread().name)

        p.thread(arrive, "patient", (None,)).start()
        p.thread(arrive, "hasty", (1.0,)).start()
    assert sorted(errors) == ["hasty", "patient"]
    assert barrier.broken


def test_a_barrier_releases_every_party_once_the_last_arrives():
    indices: list[int] = []
    with ScheduledRun(RANDOM) as run:
        p = run.primitives
        barrier = p.barrier(3, "ready")
        for i in range(2):
            p.thread(lambda: indices.append(barrier.wait()), f"t{i}").start()
        indices.append(barrier.wait())
    assert sorted(indices) == [0, 1, 2]


def test_a_barrier_reset_breaks_it_for_its_waiters_then_a_full_set_of_parties_passes():
    # #55586's unwind resets the runner's ready barrier at the start of every run.
    errors: list[str] = []
    passed: list[int] = []
    with ScheduledRun(RANDOM) as run:
        p = run.primitives
        barrier = p.barrier(2, "ready")

        def early():
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                errors.append("early")

        waiter = p.thread(early, "early")
        waiter.start()
        while barrier.n_waiting == 0:
            p.point("spin")
        barrier.reset()
        waiter.join()
        barrier.abort()
        barrier.reset()
        assert not barrier.broken
        p.thread(lambda: passed.append(barrier.wait()), "late").start()
        passed.append(barrier.wait())
    assert errors == ["early"]
    assert sorted(passed) == [0, 1]


def _two_waiters_nobody_wakes(p):
    a, b = p.event("a"), p.event("b")
    threads = [p.thread(a.wait, "waits-on-a"), p.thread(b.wait, "waits-on-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_deadlock_is_reported_at_once_naming_every_blocked_thread_and_its_stack():
    start = time.monotonic()
    with pytest.raises(ScheduleDeadlock) as info:
        with ScheduledRun(RANDOM, safety_s=30.0) as run:
            _two_waiters_nobody_wakes(run.primitives)
    assert time.monotonic() - start < 5.0  # found, not timed out
    halt = info.value.halt
    assert halt.kind == "deadlock"
    waits = {t.label: t.waiting_on for t in halt.threads}
    assert waits == {"main": "join waits-on-a", "waits-on-a": "a.wait", "waits-on-b": "b.wait"}
    main = next(t for t in halt.threads if t.label == "main")
    assert any("_two_waiters_nobody_wakes" in frame for frame in main.stack)
    assert "waits-on-b" in str(info.value)
    assert run.trace.halt == halt


def test_explore_calls_a_deadlock_a_finding_with_the_report_as_its_verdict():
    trace, verdict = run_once(RANDOM, _two_waiters_nobody_wakes, lambda result, error: None)
    assert verdict is not None and verdict.startswith("DEADLOCK")
    assert "a.wait" in verdict and "b.wait" in verdict


def test_a_thread_blocking_outside_the_primitives_halts_the_run_as_stuck_within_the_bound():
    def scenario(p):
        sleeper = p.thread(lambda: time.sleep(0.6), "sleeper")  # real blocking: no turn passed
        sleeper.start()
        sleeper.join()

    start = time.monotonic()
    with pytest.raises(HarnessCannot) as info:
        run_once(RANDOM, scenario, lambda result, error: None, safety_s=0.2)
    assert "sleeper" in str(info.value)
    assert time.monotonic() - start < 3.0


def test_a_controlled_primitive_used_from_a_thread_the_schedule_does_not_control_is_refused():
    caught: list[BaseException] = []
    with ScheduledRun(RANDOM) as run:
        event = run.primitives.event("e")

        def outsider():
            try:
                event.wait(0)
            except ScheduleMisuse as exc:
                caught.append(exc)

        stray = threading.Thread(target=outsider)
        stray.start()
        stray.join(5.0)
    assert len(caught) == 1


def test_a_replayed_choice_that_names_a_thread_that_cannot_run_is_harness_cannot():
    def scenario(p):
        t = p.thread(lambda: None, "t")
        t.start()
        t.join()

    with pytest.raises(HarnessCannot) as info:
        run_once(Schedule("random", choices=(5,)), scenario, lambda result, error: None)
    assert "diverged" in info.value.detail.lower()
