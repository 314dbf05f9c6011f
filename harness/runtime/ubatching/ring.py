"""The ring: the state one run's contexts share, and each microbatch's end of it.

Context i waits on ring event i and wakes the event its protocol names, so exactly one
microbatch thread runs Python at a time (docs/spec.md §5.1-5.2). The turn is also tracked
under a lock (`RunState.holder`), so a second runner is caught as a `ProtocolError`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from harness.runtime.overlap import RecvHook
from harness.runtime.schedule.primitives import (
    OS_PRIMITIVES,
    BarrierLike,
    EventLike,
    Primitives,
)
from harness.runtime.ubatching.errors import MicrobatchAborted, ProtocolError, Stuck
from harness.runtime.ubatching.protocols import RingProtocol


@dataclass
class RunState:
    protocol: RingProtocol
    k: int
    hang_timeout_s: float
    poll_interval_s: float
    ring: list[EventLike]
    barrier: BarrierLike
    # Makes the events and threads and reads the clock: threading's, or a schedule's.
    primitives: Primitives = OS_PRIMITIVES
    # Polled by every wait: set by `abort_pending()`, a failed start, or a failure the
    # protocol unwinds siblings for.
    abort: EventLike = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    contexts: list[UBatchContext] = field(default_factory=list)
    # Peer slots as vLLM's _CURRENT_CONTEXTS: cleared (None) when a context exits.
    slots: list[UBatchContext | None] = field(default_factory=list)
    holder: int | None = None  # which microbatch holds the turn
    started: bool = False  # finish() has woken microbatch 0
    protocol_errors: list[str] = field(default_factory=list)
    outputs: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, BaseException] = field(default_factory=dict)
    aborted: dict[int, BaseException] = field(default_factory=dict)
    stuck: set[int] = field(default_factory=set)
    threads: list[threading.Thread] = field(default_factory=list)

    def point(self, ctx: UBatchContext, what: str) -> None:
        """A handoff the schedule may put another thread before (nothing under `os`)."""
        self.primitives.point(f"ub{ctx.id}.{what}")

    def protocol_error(self, message: str) -> ProtocolError:
        with self.lock:
            self.protocol_errors.append(message)
        return ProtocolError(message)

    def on_failure(self) -> None:
        """A microbatch failed (or hung): unwind its siblings if the protocol does."""
        if self.protocol.unwinds_siblings:
            self.abort.set()


class UBatchContext:
    """One microbatch's end of the ring. Use only from its own thread."""

    def __init__(self, run: RunState, ubatch_id: int, streams: Any,
                 compute_stream: Any) -> None:
        self._run = run
        self.id = ubatch_id
        self.streams = streams
        self.compute_stream = compute_stream
        self.current_stream = compute_stream
        self.wait_event = run.ring[ubatch_id]
        self.signal_event = run.ring[(ubatch_id + 1) % run.k]
        # Pending receive hooks, one store per variant; only `run.protocol` touches them.
        self.recv_hook: RecvHook | None = None  # stock: one slot, as in vLLM
        self.inbox: list[RecvHook] = []  # abortable: hooks for me, FIFO, never overwritten
        self.own_hooks: list[RecvHook] = []  # abortable: my hooks whose target had exited
        self.exited = False
        self.done = False  # my thread has ended: it sets no event any more
        self.num_yields = 0
        self.dropped_hooks = 0
        self.thread: threading.Thread | None = None

    # -- MicrobatchOverlap ----------------------------------------------------------------

    def current_ubatch_id(self) -> int:
        return self.id

    def maybe_run_recv_hook(self) -> None:
        """Run (and clear) the receive hooks pending for me."""
        self._check_thread()
        self._run.point(self, "run_hooks")
        self._run.protocol.run_hooks(self)

    def register_recv_hook(self, hook: RecvHook) -> None:
        """Leave my receive for the next context ((id + 1) % k) to run."""
        self._check_thread()
        run = self._run
        run.point(self, "register_hook")
        run.protocol.leave_hook(self, run.slots[(self.id + 1) % run.k], hook)

    def yield_(self) -> None:
        """Wake the next context and wait for my turn; my current stream is kept."""
        self._check_thread()
        self._run.point(self, "yield")
        stream = self.current_stream
        self._cpu_yield()
        self._set_stream(stream)

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

    def _wait_turn(self) -> None:
        run = self._run
        clock = run.primitives.monotonic  # a controlled schedule's is virtual
        deadline = clock() + run.hang_timeout_s
        while True:
            if run.abort.is_set():
                raise MicrobatchAborted(f"microbatch {self.id} of {run.k} aborted")
            if self.wait_event.wait(run.poll_interval_s):
                self.wait_event.clear()
                if run.abort.is_set():
                    raise MicrobatchAborted(f"microbatch {self.id} of {run.k} aborted")
                self._take_turn()
                return
            if clock() > deadline or self._nobody_can_wake_me():
                raise Stuck()

    def _nobody_can_wake_me(self) -> bool:
        """A wait that no one can end: the run has started and every sibling's thread has
        ended, so nothing will set my event (a hang proven before its timeout)."""
        run = self._run
        # `done` first: a sibling sets my event, or the abort, before its thread ends.
        return (run.started and all(ctx.done for ctx in run.contexts if ctx is not self)
                and not run.abort.is_set() and not self.wait_event.is_set())

    def _cpu_yield(self) -> None:
        run = self._run
        self.num_yields += 1
        self._release_turn()
        nxt = run.protocol.next_to_wake(self, run.slots)
        if nxt is None:  # no live sibling to pass the turn to: keep running
            self._take_turn()
        else:
            nxt.set()
            self._wait_turn()
        run.protocol.after_turn(self)

    def _enter(self) -> None:
        self._wait_turn()
        self._set_stream(self.compute_stream)

    def _exit(self, error: BaseException | None) -> None:
        """Leave the ring: settle my pending hooks (the protocol says how), mark myself exited,
        clear my peer slot, wake the next context."""
        run = self._run
        holds_turn = run.holder == self.id
        try:
            run.protocol.settle_hooks_at_exit(self, error)
        finally:
            with run.lock:
                self.exited = True
                run.slots[self.id] = None
                if run.holder == self.id:
                    run.holder = None
            if holds_turn and run.protocol.wakes_next_on_exit(error):
                nxt = run.protocol.next_to_wake(self, run.slots)
                if nxt is not None:
                    nxt.set()
