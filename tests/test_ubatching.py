"""The microbatch thread protocol (docs/spec.md §5, invariants 18-21 of §8, bugs §7.3/§7.4)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from harness.runtime.overlap import MicrobatchOverlap
from harness.runtime.streams import CpuStreams
from harness.runtime.ubatching import (
    THREAD_OVERLAP,
    MicrobatchHang,
    MicrobatchThreads,
    UBatchContext,
    current_context,
)

HANG_S = 0.5
NEVER = math.inf  # no hang timeout: whatever ends a wait, it is not the clock


def make_runner(variant: str = "abortable", **kw) -> MicrobatchThreads:
    kw.setdefault("hang_timeout_s", HANG_S)
    kw.setdefault("poll_interval_s", 0.01)
    kw.setdefault("barrier_timeout_s", 5.0)
    kw.setdefault("join_timeout_s", 3.0)
    return MicrobatchThreads(variant, **kw)


def start(runner: MicrobatchThreads, bodies):
    streams = CpuStreams()
    compute = streams.new_stream("compute")
    return runner.begin_run(bodies, streams, compute)


def run(runner: MicrobatchThreads, bodies):
    return start(runner, bodies)()


@pytest.fixture(params=["stock", "abortable"])
def variant(request) -> str:
    return request.param


def test_a_one_yield_body_hands_off_as_enter0_enter1_exit0_exit1(variant):
    log: list[str] = []

    def body(ctx: UBatchContext) -> int:
        log.append(f"enter{ctx.id}")
        ctx.yield_()
        log.append(f"exit{ctx.id}")
        return ctx.id

    runner = make_runner(variant)
    assert run(runner, [body, body]) == [0, 1]
    assert log == ["enter0", "enter1", "exit0", "exit1"]
    assert runner.alive_threads() == []


@pytest.mark.parametrize("k", [2, 3, 4])
def test_exactly_one_microbatch_thread_runs_at_a_time(variant, k):
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def section() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1

    def body(ctx: UBatchContext) -> int:
        for _ in range(4):
            section()
            ctx.yield_()
        section()
        return ctx.id

    runner = make_runner(variant)
    assert run(runner, [body] * k) == list(range(k))
    assert peak[0] == 1
    assert runner.protocol_errors == []


@pytest.mark.parametrize("k", [2, 3])
def test_a_recv_hook_registered_by_i_runs_in_the_next_microbatch_before_its_next_yield(
        variant, k):
    ran: list[tuple[int, int, int]] = []  # (registrant, step, runner id)

    def body(ctx: UBatchContext) -> int:
        for step in range(3):
            ctx.maybe_run_recv_hook()
            ctx.register_recv_hook(
                lambda i=ctx.id, s=step: ran.append((i, s, current_context().id)))
            ctx.yield_()
        return ctx.id

    run(make_runner(variant), [body] * k)
    assert sorted((i, s) for i, s, _ in ran) == [(i, s) for i in range(k) for s in range(3)]
    assert all(runner_id == (i + 1) % k for i, _, runner_id in ran)


def test_a_recv_hook_still_pending_when_the_next_microbatch_exits_runs_at_its_exit(variant):
    ran: list[int] = []

    def body(ctx: UBatchContext) -> None:
        ctx.yield_()
        if ctx.id == 0:  # ub1 is parked in its yield; it resumes straight into its exit
            ctx.register_recv_hook(lambda: ran.append(current_context().id))

    runner = make_runner(variant)
    run(runner, [body, body])
    assert ran == [1]
    assert all(ctx.dropped_hooks == 0 for ctx in runner.last_run_contexts)


def test_outputs_are_merged_in_id_order_even_when_later_ids_finish_first(variant):
    def body(ctx: UBatchContext) -> str:
        if ctx.id == 0:
            ctx.yield_()
            ctx.yield_()
        return f"out{ctx.id}"

    # Stock would hang if ub0 yields with nobody left; give the others matching yields.
    def other(ctx: UBatchContext) -> str:
        ctx.yield_()
        ctx.yield_()
        return f"out{ctx.id}"

    assert run(make_runner(variant), [body, other, other]) == ["out0", "out1", "out2"]


def test_the_thread_overlap_object_implements_the_protocol_for_the_calling_thread(variant):
    assert isinstance(THREAD_OVERLAP, MicrobatchOverlap)
    seen: list[int] = []

    def body(ctx: UBatchContext) -> int:
        overlap = THREAD_OVERLAP
        overlap.maybe_run_recv_hook()
        overlap.register_recv_hook(lambda: seen.append(overlap.current_ubatch_id()))
        overlap.yield_()
        overlap.maybe_run_recv_hook()
        return overlap.current_ubatch_id()

    assert run(make_runner(variant), [body, body]) == [0, 1]
    assert sorted(seen) == [0, 1]
    # Outside a microbatch thread it is NoOverlap: the hook runs at once.
    here: list[int] = []
    THREAD_OVERLAP.register_recv_hook(lambda: here.append(1))
    assert here == [1] and THREAD_OVERLAP.current_ubatch_id() == 0


def test_each_microbatch_runs_on_the_compute_stream_and_keeps_it_across_yields(variant):
    # At capture the compute stream is the capture stream: every launch must land there.
    seen: list[tuple[int, str]] = []

    def body(ctx: UBatchContext) -> None:
        for _ in range(2):
            seen.append((ctx.id, ctx.streams.current_stream().name))
            ctx.yield_()
        seen.append((ctx.id, ctx.streams.current_stream().name))

    run(make_runner(variant), [body, body])
    for i in (0, 1):
        assert [s for j, s in seen if j == i] == ["compute"] * 3


def fails_after_one_yield_while_sibling_yields_twice(ctx: UBatchContext) -> None:
    ctx.yield_()
    if ctx.id == 0:
        raise ValueError("boom in ub0")
    ctx.yield_()
    ctx.yield_()


def test_stock_bug_12_4_a_failure_strands_the_survivor_and_is_reported_as_a_hang():
    runner = make_runner("stock")
    with pytest.raises(MicrobatchHang) as info:
        run(runner, [fails_after_one_yield_while_sibling_yields_twice] * 2)
    assert info.value.stuck_ids == (1,)
    assert info.value.failed_ids == (0,)
    assert isinstance(info.value.__cause__, ValueError)
    assert runner.alive_threads() == []


def test_a_survivor_no_sibling_is_left_to_wake_proves_its_hang_without_a_timeout():
    # No hang timeout at all: a survivor that did not prove the hang itself would still be
    # waiting when the join gives up, and stay alive.
    runner = make_runner("stock", hang_timeout_s=NEVER)
    with pytest.raises(MicrobatchHang) as info:
        run(runner, [fails_after_one_yield_while_sibling_yields_twice] * 2)
    assert (info.value.stuck_ids, info.value.failed_ids) == ((1,), (0,))
    assert runner.alive_threads() == []


def test_abortable_a_failure_aborts_siblings_and_names_microbatch_0():
    seen: list[tuple[int, str]] = []

    def body(ctx: UBatchContext) -> None:
        try:
            fails_after_one_yield_while_sibling_yields_twice(ctx)
        except BaseException as exc:
            seen.append((ctx.id, type(exc).__name__))
            raise

    # No hang timeout: the sibling ends by the abort, or it proves a hang (MicrobatchHang).
    runner = make_runner("abortable", hang_timeout_s=NEVER)
    with pytest.raises(RuntimeError, match=r"^Microbatch 0 of 2 failed$") as info:
        run(runner, [body] * 2)
    assert isinstance(info.value.__cause__, ValueError)
    assert sorted(seen) == [(0, "ValueError"), (1, "MicrobatchAborted")]
    assert runner.alive_threads() == []


def test_abortable_names_the_lowest_original_failure_not_an_aborted_sibling():
    def body(ctx: UBatchContext) -> None:
        ctx.yield_()
        if ctx.id in (1, 2):
            raise KeyError(f"ub{ctx.id}")
        ctx.yield_()

    runner = make_runner("abortable", hang_timeout_s=30.0)
    with pytest.raises(RuntimeError, match=r"^Microbatch 1 of 3 failed$") as info:
        run(runner, [body] * 3)
    assert isinstance(info.value.__cause__, KeyError)
    assert runner.alive_threads() == []


def returns_at_once_or_registers_a_hook(log: list[str]):
    def body(ctx: UBatchContext) -> int:
        if ctx.id == 0:
            return 0
        ctx.register_recv_hook(lambda: log.append(f"hook ran in {current_context().id}"))
        ctx.yield_()
        log.append("ub1 after yield")
        return 1
    return body


def test_stock_bug_12_3_registering_a_hook_for_an_exited_peer_raises_attribute_error():
    runner = make_runner("stock")
    with pytest.raises(RuntimeError, match=r"^Microbatch 1 of 2 failed$") as info:
        run(runner, [returns_at_once_or_registers_a_hook([])] * 2)
    cause = info.value.__cause__
    assert isinstance(cause, AttributeError)
    assert str(cause) == "'NoneType' object has no attribute 'recv_hook'"
    assert runner.alive_threads() == []


def test_abortable_runs_a_hook_for_an_exited_peer_in_the_registrant_before_its_yield_returns():
    log: list[str] = []
    runner = make_runner("abortable")
    assert run(runner, [returns_at_once_or_registers_a_hook(log)] * 2) == [0, 1]
    assert log == ["hook ran in 1", "ub1 after yield"]
    assert all(ctx.dropped_hooks == 0 for ctx in runner.last_run_contexts)


def test_abort_pending_releases_parked_threads_and_leaves_none_alive(variant):
    entered: list[int] = []

    def body(ctx: UBatchContext) -> None:
        entered.append(ctx.id)

    # No hang timeout: only the abort can release them before the join gives up.
    runner = make_runner(variant, hang_timeout_s=NEVER)
    finish = start(runner, [body] * 3)
    assert len(runner.alive_threads()) == 3  # parked past the barrier, waiting for the turn
    assert runner.abort_pending() == []
    assert runner.alive_threads() == [] and entered == []
    assert runner.abort_pending() == []  # idempotent
    with pytest.raises(RuntimeError, match="after abort_pending"):
        finish()


def test_a_second_begin_run_before_finishing_the_first_is_refused():
    runner = make_runner()
    finish = start(runner, [lambda ctx: ctx.id] * 2)
    with pytest.raises(RuntimeError, match="still pending"):
        start(runner, [lambda ctx: ctx.id] * 2)
    assert finish() == [0, 1]


def test_unknown_variants_and_single_microbatches_are_rejected():
    with pytest.raises(ValueError, match="unknown ubatching variant"):
        MicrobatchThreads("fast")
    with pytest.raises(ValueError, match="at least 2"):
        start(make_runner(), [lambda ctx: 0])
