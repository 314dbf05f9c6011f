"""`MicrobatchThreads`: starts k microbatch threads per run and finishes or aborts the run.

The starter and the k threads meet at a ready barrier (outside any graph); `finish()` wakes
microbatch 0, joins the threads and merges their outputs in id order. Every wait gives up
after `hang_timeout_s`, or at once when every sibling's thread has ended (no one is left to
wake it): the stuck thread ends without running its exit protocol, and `finish()` raises
`MicrobatchHang` naming the stuck ids.

Limitation: Python threads cannot be killed. A microbatch stuck outside a protocol wait (e.g. a
body spinning forever) stays alive after `finish()`; it is a daemon thread, is reported by
`MicrobatchHang`/`alive_threads()`, and does not block interpreter exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from harness.runtime.schedule.primitives import OS_PRIMITIVES, Primitives
from harness.runtime.ubatching.binding import THREAD_OVERLAP, ThreadOverlap, bind
from harness.runtime.ubatching.errors import (
    MicrobatchAborted,
    MicrobatchFailed,
    MicrobatchHang,
    Stuck,
)
from harness.runtime.ubatching.protocols import DEFAULT_VARIANT, protocol_for
from harness.runtime.ubatching.ring import RunState, UBatchContext
from harness.timeouts import microbatch_join_wait_s

T = TypeVar("T")


def _thread_main(run: RunState, ctx: UBatchContext, body: Callable[[UBatchContext], Any],
                 barrier_timeout_s: float, setup: Callable[[], None] | None) -> None:
    bind(ctx)
    try:
        try:
            if setup is not None:
                setup()  # per-thread set-up (device, library workspaces) before the barrier
        except BaseException as exc:  # reported by finish() like a body failure
            run.failures[ctx.id] = exc
            run.barrier.abort()
            return
        try:
            run.barrier.wait(barrier_timeout_s)
        except threading.BrokenBarrierError as exc:
            run.aborted[ctx.id] = exc
            return
        try:
            ctx._enter()
        except MicrobatchAborted as exc:
            ctx._exit(exc)
            run.aborted[ctx.id] = exc
            return
        try:
            out = body(ctx)
        except Stuck:
            raise
        except BaseException as exc:  # stored and re-raised by finish()
            if not isinstance(exc, MicrobatchAborted):
                run.on_failure()
            try:
                ctx._exit(exc)
            finally:
                if isinstance(exc, MicrobatchAborted):
                    run.aborted[ctx.id] = exc
                else:
                    run.failures[ctx.id] = exc
            return
        try:
            ctx._exit(None)
        except BaseException as exc:  # a recv hook failed at exit
            run.on_failure()
            run.failures[ctx.id] = exc
            return
        run.outputs[ctx.id] = out
    except Stuck:
        run.stuck.add(ctx.id)
        run.on_failure()
    except BaseException as exc:  # protocol errors outside the body
        run.failures[ctx.id] = exc
        run.on_failure()
    finally:
        ctx.done = True
        bind(None)
        try:
            ctx.streams.set_current_stream(ctx.streams.default_stream)
        except Exception:  # best effort
            pass


class MicrobatchThreads(Generic[T]):
    """Starts k microbatch threads per run and finishes or aborts the run.

    Contract (docs/spec.md §5.1): call the `finish` returned by `begin_run` exactly once on the
    starting thread, or call `abort_pending()`. `primitives` makes each run's events, barrier
    and threads, and reads its clock: `threading`'s by default, or a controlled schedule's
    (docs/schedules.md), under which the starting thread must be the schedule's.
    """

    def __init__(self, variant: str = DEFAULT_VARIANT, *, hang_timeout_s: float = 30.0,
                 poll_interval_s: float = 0.02, barrier_timeout_s: float = 10.0,
                 join_timeout_s: float | None = None,
                 primitives: Primitives = OS_PRIMITIVES) -> None:
        self.primitives = primitives
        self.protocol = protocol_for(variant)
        self.variant = variant
        self.hang_timeout_s = hang_timeout_s
        self.poll_interval_s = poll_interval_s
        self.barrier_timeout_s = barrier_timeout_s
        self.join_timeout_s = (join_timeout_s if join_timeout_s is not None
                               else microbatch_join_wait_s(hang_timeout_s))
        self._pending: RunState | None = None
        self._last: RunState | None = None

    @property
    def overlap(self) -> ThreadOverlap:
        return THREAD_OVERLAP

    @property
    def last_run_contexts(self) -> list[UBatchContext]:
        return list(self._last.contexts) if self._last is not None else []

    @property
    def protocol_errors(self) -> list[str]:
        return list(self._last.protocol_errors) if self._last is not None else []

    def alive_threads(self) -> list[threading.Thread]:
        """Microbatch threads of the latest run that are still alive."""
        run = self._last
        return [t for t in run.threads if t.is_alive()] if run is not None else []

    def begin_run(self, bodies: Sequence[Callable[[UBatchContext], T]], streams: Any,
                  compute_stream: Any, setup: Callable[[], None] | None = None
                  ) -> Callable[[], list[T]]:
        """Start one thread per body, park them at the ready barrier, return `finish`.

        `setup` runs first in every thread, before the barrier (outside any graph capture).
        """
        if self._pending is not None:
            raise RuntimeError("a microbatched run is still pending: finish or abort it first")
        k = len(bodies)
        if k < 2:
            raise ValueError(f"microbatching needs at least 2 microbatches, got {k}")
        prims = self.primitives
        run = RunState(protocol=self.protocol, k=k, hang_timeout_s=self.hang_timeout_s,
                       poll_interval_s=self.poll_interval_s,
                       ring=[prims.event(f"ring[{i}]") for i in range(k)],
                       barrier=prims.barrier(k + 1, "ready"), primitives=prims,
                       abort=prims.event("abort"))
        run.contexts = [UBatchContext(run, i, streams, compute_stream)
                        for i in range(k)]
        run.slots = list(run.contexts)
        for ctx, body in zip(run.contexts, bodies, strict=True):
            thread = prims.thread(_thread_main, f"ubatch-{ctx.id}",
                                  (run, ctx, body, self.barrier_timeout_s, setup))
            ctx.thread = thread
            run.threads.append(thread)
        self._last = run
        for thread in run.threads:
            thread.start()
        try:
            run.barrier.wait(self.barrier_timeout_s)
        except threading.BrokenBarrierError:
            run.abort.set()
            self._join(run)
            raise RuntimeError(f"microbatch threads did not reach the ready barrier within "
                               f"{self.barrier_timeout_s} s") from None
        self._pending = run

        def finish() -> list[T]:
            if self._pending is not run:
                raise RuntimeError("finish() called twice or after abort_pending()")
            try:
                run.ring[0].set()  # wake microbatch 0
                run.started = True
                self._join(run)
            finally:
                self._pending = None
            return self._result(run)

        return finish

    def run(self, bodies: Sequence[Callable[[UBatchContext], T]], streams: Any,
            compute_stream: Any) -> list[T]:
        """Eager run: `begin_run(...)()`."""
        return self.begin_run(bodies, streams, compute_stream)()

    def abort_pending(self) -> list[int]:
        """Release a begun run that will never be finished; returns ids still alive (empty
        unless a thread is stuck outside the protocol). Never raises for thread failures."""
        run = self._pending
        if run is None:
            return []
        self._pending = None
        run.abort.set()
        self._join(run)
        return [ctx.id for ctx in run.contexts if ctx.thread is not None
                and ctx.thread.is_alive()]

    def _join(self, run: RunState) -> None:
        clock = run.primitives.monotonic  # a controlled schedule's is virtual
        deadline = clock() + self.join_timeout_s
        for thread in run.threads:
            thread.join(max(0.0, deadline - clock()))
        if run.protocol.unwinds_siblings and any(t.is_alive() for t in run.threads):
            run.abort.set()  # release whoever is still in a wait
            for thread in run.threads:
                thread.join(max(0.0, min(1.0, deadline + 1.0 - clock())))

    def _result(self, run: RunState) -> list[T]:
        alive = {ctx.id for ctx in run.contexts if ctx.thread is not None
                 and ctx.thread.is_alive()}
        failed = sorted(run.failures)
        stuck = run.stuck | alive
        cause = run.failures[failed[0]] if failed else None
        if stuck:
            raise MicrobatchHang(stuck, run.k, failed) from cause
        if failed:
            raise MicrobatchFailed(failed[0], run.k) from cause
        if run.aborted:
            first = min(run.aborted)
            raise RuntimeError(f"Microbatch {first} of {run.k} was aborted") \
                from run.aborted[first]
        return [run.outputs[i] for i in range(run.k)]
