"""The microbatch ("DBO") thread protocol: k threads pass one turn around a ring.

dbo-reference 3.5-3.7 and 5. Context i waits on ring event i and wakes ring event (i+1) % k,
so exactly one microbatch thread runs Python at a time. The starter and the k threads meet at a
ready barrier (outside any graph); `finish()` wakes microbatch 0, joins the threads and merges
their outputs in id order.

Two variants, chosen by name:

- ``stock``: faithful to vLLM, bugs included. A failing microbatch never yields again; its exit
  runs its pending recv hook and wakes the next context once, so a survivor that yields again
  waits forever (bug 12.4). "Forever" is bounded here: every wait gives up after
  ``hang_timeout_s``, the stuck thread ends without running its exit protocol, and `finish()`
  raises `MicrobatchHang` naming the stuck ids. A context's peer slot is cleared on exit, so
  registering a recv hook for an exited peer raises
  ``AttributeError("'NoneType' object has no attribute 'recv_hook'")`` (bug 12.3).
- ``abortable`` (default): one abort event per run that every wait polls. A failing
  microbatch sets it, so every sibling raises `MicrobatchAborted` at its next wait and unwinds;
  `finish()` names the lowest *original* failure (aborted siblings are not failures). The ring
  skips exited contexts: a yield or exit wakes the next live context, and a yield with no live
  sibling returns at once. A recv hook registered for an exited peer is retargeted to the
  registrant itself and runs when its next `yield_()` gets the turn back (or earlier at its own
  `maybe_run_recv_hook()`, or at its exit) - before the body reads the received data, never
  dropped. Pending recv hooks of a context that fails or is aborted are dropped (counted in
  `UBatchContext.dropped_hooks`): a receive whose sender died must not be waited on.

The MoE layer takes one `MicrobatchOverlap`; `THREAD_OVERLAP` (also `UBatchRunner.overlap`)
implements it for whichever microbatch thread calls it, and behaves like `NoOverlap` on a
thread that is not a microbatch thread. A context also implements it itself.

Limitation: Python threads cannot be killed. A microbatch stuck outside a protocol wait (e.g. a
body spinning forever) stays alive after `finish()`; it is a daemon thread, is reported by
`MicrobatchHang`/`alive_threads()`, and does not block interpreter exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from harness.model.overlap import RecvHook

T = TypeVar("T")

VARIANTS = ("stock", "abortable")
DEFAULT_VARIANT = "abortable"


class ProtocolError(RuntimeError):
    """The handoff protocol was broken: two microbatch threads ran at once, or a context was
    used from a thread that is not its own."""


class MicrobatchAborted(RuntimeError):
    """Raised in a microbatch thread when its run is aborted (a sibling failed, or
    `abort_pending()`); the thread unwinds without running recv hooks."""


class MicrobatchHang(RuntimeError):
    """A run that the stock protocol would never finish: `stuck_ids` waited past the hang
    timeout (or were still alive when the join bound ran out)."""

    def __init__(self, stuck_ids: Sequence[int], num_ubatches: int,
                 failed_ids: Sequence[int] = ()) -> None:
        self.stuck_ids = tuple(sorted(stuck_ids))
        self.num_ubatches = num_ubatches
        self.failed_ids = tuple(sorted(failed_ids))
        failed = f"; failed: {list(self.failed_ids)}" if self.failed_ids else ""
        super().__init__(f"HANG: microbatch(es) {list(self.stuck_ids)} of {num_ubatches} "
                         f"never got the turn back{failed}")


class _Stuck(BaseException):
    """Internal: a wait passed the hang timeout. BaseException so that bodies that catch
    Exception cannot swallow it; the thread ends as if it had hung."""


# ---------------------------------------------------------------------------------------------
# per-thread binding

_TLS = threading.local()


def current_context() -> UBatchContext | None:
    """The microbatch context bound to the calling thread, if it is a microbatch thread."""
    return getattr(_TLS, "ctx", None)


class ThreadOverlap:
    """`MicrobatchOverlap` for whichever microbatch thread calls it; outside a microbatch
    thread it behaves like `NoOverlap(0)` (a registered hook runs at once)."""

    def maybe_run_recv_hook(self) -> None:
        ctx = current_context()
        if ctx is not None:
            ctx.maybe_run_recv_hook()

    def register_recv_hook(self, hook: RecvHook) -> None:
        ctx = current_context()
        if ctx is None:
            hook()
        else:
            ctx.register_recv_hook(hook)

    def yield_(self) -> None:
        ctx = current_context()
        if ctx is not None:
            ctx.yield_()

    def current_ubatch_id(self) -> int:
        ctx = current_context()
        return 0 if ctx is None else ctx.id


THREAD_OVERLAP = ThreadOverlap()


# ---------------------------------------------------------------------------------------------
# one run's shared state


@dataclass
class _RunState:
    variant: str
    k: int
    hang_timeout_s: float
    poll_interval_s: float
    ring: list[threading.Event]
    barrier: threading.Barrier
    abort: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    contexts: list[UBatchContext] = field(default_factory=list)
    # Peer slots as vLLM's _CURRENT_CONTEXTS: cleared (None) when a context exits.
    slots: list[UBatchContext | None] = field(default_factory=list)
    holder: int | None = None  # which microbatch holds the turn
    protocol_errors: list[str] = field(default_factory=list)
    outputs: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, BaseException] = field(default_factory=dict)
    aborted: dict[int, BaseException] = field(default_factory=dict)
    stuck: set[int] = field(default_factory=set)
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def abortable(self) -> bool:
        return self.variant == "abortable"

    def protocol_error(self, message: str) -> ProtocolError:
        with self.lock:
            self.protocol_errors.append(message)
        return ProtocolError(message)


class UBatchContext:
    """One microbatch's end of the ring. Use only from its own thread."""

    def __init__(self, run: _RunState, ubatch_id: int, streams: Any, compute_stream: Any,
                 comm_stream: Any) -> None:
        self._run = run
        self.id = ubatch_id
        self.streams = streams
        self.compute_stream = compute_stream
        self.comm_stream = comm_stream
        self.current_stream = compute_stream
        self.wait_event = run.ring[ubatch_id]
        self.signal_event = run.ring[(ubatch_id + 1) % run.k]
        self.compute_done = streams.new_event(f"ub{ubatch_id}-compute-done")
        self.comm_done = streams.new_event(f"ub{ubatch_id}-comm-done")
        self.recv_hook: RecvHook | None = None  # stock: one slot, as in vLLM
        self._hooks: list[RecvHook] = []  # abortable: hooks for me, FIFO, never overwritten
        self._own_hooks: list[RecvHook] = []  # abortable: my hooks whose target had exited
        self.exited = False
        self.num_yields = 0
        self.dropped_hooks = 0
        self.thread: threading.Thread | None = None

    # -- MicrobatchOverlap ----------------------------------------------------------------

    def current_ubatch_id(self) -> int:
        return self.id

    def maybe_run_recv_hook(self) -> None:
        """Run (and clear) what a sibling left for me (abortable: plus my retargeted hooks)."""
        self._check_thread()
        if self._run.abortable:
            while self._hooks or self._own_hooks:
                hook = (self._hooks or self._own_hooks).pop(0)
                hook()
        elif self.recv_hook is not None:
            hook, self.recv_hook = self.recv_hook, None
            hook()

    def register_recv_hook(self, hook: RecvHook) -> None:
        """Leave my receive for the next context ((id + 1) % k) to run."""
        self._check_thread()
        run = self._run
        peer = run.slots[(self.id + 1) % run.k]
        if not run.abortable:
            if peer is not None and peer.recv_hook is not None:
                peer.dropped_hooks += 1  # vLLM overwrites the slot
            peer.recv_hook = hook  # peer None -> AttributeError, bug 12.3
        elif peer is None or peer is self:
            self._own_hooks.append(hook)
        else:
            peer._hooks.append(hook)

    def yield_(self) -> None:
        """Wake the next context and wait for my turn; my current stream is kept."""
        self._check_thread()
        stream = self.current_stream
        self._cpu_yield()
        self._set_stream(stream)

    # -- stream-switching yields --------------------------------------------------------------

    def yield_and_switch_to_comm(self) -> None:
        self._yield_and_switch(self.comm_stream, self.compute_done)

    def yield_and_switch_to_compute(self) -> None:
        self._yield_and_switch(self.compute_stream, self.comm_done)

    def _yield_and_switch(self, target: Any, event: Any) -> None:
        self._check_thread()
        event.record(self.current_stream)
        self._cpu_yield()
        self._set_stream(target)
        event.wait(target)

    # -- protocol internals -----------------------------------------------------------------

    def _check_thread(self) -> None:
        if self.thread is not None and threading.current_thread() is not self.thread:
            raise self._run.protocol_error(
                f"microbatch {self.id}'s context used from thread "
                f"{threading.current_thread().name!r}")

    def _set_stream(self, stream: Any) -> None:
        self.current_stream = stream
        self.streams.set_current_stream(stream)

    def _take_turn(self) -> None:
        run = self._run
        with run.lock:
            holder = run.holder
            if holder is None:
                run.holder = self.id
                return
        raise run.protocol_error(
            f"microbatch {self.id} woke while microbatch {holder} holds the turn")

    def _release_turn(self) -> None:
        run = self._run
        with run.lock:
            if run.holder == self.id:
                run.holder = None
                return
            holder = run.holder
        raise run.protocol_error(
            f"microbatch {self.id} released a turn held by {holder}")

    def _next_event(self) -> threading.Event | None:
        """The event to wake: stock the fixed ring neighbour; abortable the next live one."""
        run = self._run
        if not run.abortable:
            return self.signal_event
        for step in range(1, run.k):
            peer = run.slots[(self.id + step) % run.k]
            if peer is not None:
                return peer.wait_event
        return None

    def _wait_turn(self) -> None:
        run = self._run
        deadline = time.monotonic() + run.hang_timeout_s
        while True:
            if run.abort.is_set():
                raise MicrobatchAborted(f"microbatch {self.id} of {run.k} aborted")
            if self.wait_event.wait(run.poll_interval_s):
                self.wait_event.clear()
                if run.abort.is_set():
                    raise MicrobatchAborted(f"microbatch {self.id} of {run.k} aborted")
                self._take_turn()
                return
            if time.monotonic() > deadline:
                raise _Stuck()

    def _cpu_yield(self) -> None:
        self.num_yields += 1
        self._release_turn()
        nxt = self._next_event()
        if nxt is None:  # abortable, no live sibling: keep running
            self._take_turn()
        else:
            nxt.set()
            self._wait_turn()
        if self._own_hooks:  # abortable: my receive whose target had exited
            while self._own_hooks:
                self._own_hooks.pop(0)()

    def _enter(self) -> None:
        self._wait_turn()
        self._set_stream(self.compute_stream)

    def _exit(self, error: BaseException | None) -> None:
        """Leave the ring: run my pending hook (stock always; abortable only on success), mark
        myself exited, clear my peer slot, wake the next context."""
        run = self._run
        holds_turn = run.holder == self.id
        try:
            if not run.abortable or error is None:
                self.maybe_run_recv_hook()
        finally:
            if run.abortable:
                self.dropped_hooks += len(self._hooks) + len(self._own_hooks)
                self._hooks.clear()
                self._own_hooks.clear()
            with run.lock:
                self.exited = True
                run.slots[self.id] = None
                if run.holder == self.id:
                    run.holder = None
            if holds_turn and not (run.abortable and isinstance(error, MicrobatchAborted)):
                nxt = self._next_event()
                if nxt is not None:
                    nxt.set()


# ---------------------------------------------------------------------------------------------
# runner


def _thread_main(run: _RunState, ctx: UBatchContext, body: Callable[[UBatchContext], Any],
                 barrier_timeout_s: float, setup: Callable[[], None] | None) -> None:
    _TLS.ctx = ctx
    try:
        try:
            if setup is not None:
                setup()  # per-thread set-up (device, library workspaces) before the barrier
        except BaseException as exc:  # noqa: BLE001 - reported by finish() like a body failure
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
        except _Stuck:
            raise
        except BaseException as exc:  # noqa: BLE001 - stored and re-raised by finish()
            if run.abortable and not isinstance(exc, MicrobatchAborted):
                run.abort.set()  # tell every sibling to unwind
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
        except BaseException as exc:  # noqa: BLE001 - a recv hook failed at exit
            if run.abortable:
                run.abort.set()
            run.failures[ctx.id] = exc
            return
        run.outputs[ctx.id] = out
    except _Stuck:
        run.stuck.add(ctx.id)
        if run.abortable:
            run.abort.set()
    except BaseException as exc:  # noqa: BLE001 - protocol errors outside the body
        run.failures[ctx.id] = exc
        if run.abortable:
            run.abort.set()
    finally:
        _TLS.ctx = None
        try:
            ctx.streams.set_current_stream(ctx.streams.default_stream)
        except Exception:  # noqa: BLE001 - best effort
            pass


class UBatchRunner(Generic[T]):
    """Starts k microbatch threads per run and finishes or aborts the run.

    Contract (dbo-reference 3.5): call the `finish` returned by `begin_run` exactly once on the
    starting thread, or call `abort_pending()`.
    """

    def __init__(self, variant: str = DEFAULT_VARIANT, *, hang_timeout_s: float = 30.0,
                 poll_interval_s: float = 0.02, barrier_timeout_s: float = 10.0,
                 join_timeout_s: float | None = None) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown ubatching variant {variant!r}; expected one of {VARIANTS}")
        self.variant = variant
        self.hang_timeout_s = hang_timeout_s
        self.poll_interval_s = poll_interval_s
        self.barrier_timeout_s = barrier_timeout_s
        self.join_timeout_s = (join_timeout_s if join_timeout_s is not None
                               else hang_timeout_s + 5.0)
        self._pending: _RunState | None = None
        self._last: _RunState | None = None

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
                  compute_stream: Any, comm_stream: Any,
                  setup: Callable[[], None] | None = None) -> Callable[[], list[T]]:
        """Start one thread per body, park them at the ready barrier, return `finish`.

        `setup` runs first in every thread, before the barrier (outside any graph capture).
        """
        if self._pending is not None:
            raise RuntimeError("a microbatched run is still pending: finish or abort it first")
        k = len(bodies)
        if k < 2:
            raise ValueError(f"microbatching needs at least 2 microbatches, got {k}")
        run = _RunState(variant=self.variant, k=k, hang_timeout_s=self.hang_timeout_s,
                        poll_interval_s=self.poll_interval_s,
                        ring=[threading.Event() for _ in range(k)],
                        barrier=threading.Barrier(k + 1))
        run.contexts = [UBatchContext(run, i, streams, compute_stream, comm_stream)
                        for i in range(k)]
        run.slots = list(run.contexts)
        for ctx, body in zip(run.contexts, bodies, strict=True):
            thread = threading.Thread(target=_thread_main, name=f"ubatch-{ctx.id}", daemon=True,
                                      args=(run, ctx, body, self.barrier_timeout_s, setup))
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
                self._join(run)
            finally:
                self._pending = None
            return self._result(run)

        return finish

    def run(self, bodies: Sequence[Callable[[UBatchContext], T]], streams: Any,
            compute_stream: Any, comm_stream: Any) -> list[T]:
        """Eager run: `begin_run(...)()`."""
        return self.begin_run(bodies, streams, compute_stream, comm_stream)()

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

    def _join(self, run: _RunState) -> None:
        deadline = time.monotonic() + self.join_timeout_s
        for thread in run.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if run.abortable and any(t.is_alive() for t in run.threads):
            run.abort.set()  # release whoever is still in a wait
            for thread in run.threads:
                thread.join(max(0.0, min(1.0, deadline + 1.0 - time.monotonic())))

    def _result(self, run: _RunState) -> list[T]:
        alive = {ctx.id for ctx in run.contexts if ctx.thread is not None
                 and ctx.thread.is_alive()}
        failed = sorted(run.failures)
        stuck = run.stuck | alive
        cause = run.failures[failed[0]] if failed else None
        if stuck:
            raise MicrobatchHang(stuck, run.k, failed) from cause
        if failed:
            raise RuntimeError(f"Microbatch {failed[0]} of {run.k} failed") from cause
        if run.aborted:
            first = min(run.aborted)
            raise RuntimeError(f"Microbatch {first} of {run.k} was aborted") \
                from run.aborted[first]
        return [run.outputs[i] for i in range(run.k)]
