"""The controlled scheduler: one thread runs at a time, and at every scheduling point its
strategy picks who runs next.

A token (`_running`) says which controlled thread may run; every other one is parked on a
real condition, each park bounded by `safety_s` (a thread that blocks outside the controlled
primitives halts the run as *stuck*, so nothing hangs). A blocked thread is made runnable by
`wake` (an event set, a barrier filling, a thread ending) or by its timeout, which is
virtual: it expires only when no thread can run, the earliest deadline first (ties: lowest
thread number), and the virtual clock jumps to it. No runnable thread and no timed waiter is a
deadlock, halted at once with every thread's label, wait and stack.
"""

from __future__ import annotations

import threading
import time

from harness.runtime.schedule.errors import ScheduleMisuse, halted
from harness.runtime.schedule.records import Decision, Halt, ThreadReport, stack_of
from harness.runtime.schedule.strategies import ReplayMismatch, Strategy

NEW, RUNNABLE, BLOCKED, FINISHED = "not started", "runnable", "blocked", "finished"
# Timeouts expiring in a row with nothing woken or started or ended: a livelock of polls.
MAX_IDLE_EXPIRIES = 100_000


class ThreadSlot:
    """The scheduler's view of one controlled thread."""

    def __init__(self, ordinal: int, label: str, lock: threading.Lock) -> None:
        self.turn = threading.Condition(lock)  # notified when I get the turn
        self.ordinal = ordinal
        self.label = label
        self.ident: int | None = None
        self.state = NEW
        self.waiting_on: object = None  # what a wake must name to make me runnable
        self.waiting_in = ""  # the operation I am blocked in
        self.deadline: float | None = None  # virtual
        self.wake_value: object = None  # what my blocking call returns; None: it expired

    @property
    def finished(self) -> bool:
        return self.state == FINISHED


class Scheduler:
    def __init__(self, strategy: Strategy, safety_s: float = 60.0) -> None:
        self._strategy = strategy
        self.safety_s = safety_s
        self._lock = threading.Lock()  # guards all state; each thread parks on its `turn`
        self.threads: list[ThreadSlot] = []
        self._by_ident: dict[int, ThreadSlot] = {}
        self._running: ThreadSlot | None = None
        self.halt: Halt | None = None
        self.closed = False
        self.clock = 0.0
        self.points = 0
        self.decisions: list[Decision] = []
        self._idle_expiries = 0
        self.all_done = object()  # woken when every thread but the adopted ones has ended
        self._adopted: set[int] = set()

    # -- membership ---------------------------------------------------------------------------

    def adopt(self, label: str) -> ThreadSlot:
        """The calling thread joins, holding the turn (the thread that starts the others)."""
        with self._lock:
            slot = self._new_slot(label)
            slot.ident = threading.get_ident()
            slot.state = RUNNABLE
            self._by_ident[slot.ident] = slot
            self._adopted.add(slot.ordinal)
            self._running = slot
            return slot

    def register(self, label: str) -> ThreadSlot:
        """A thread about to start; numbered in start order, which the turn makes fixed."""
        with self._lock:
            self._caller()
            slot = self._new_slot(label)
            slot.state = RUNNABLE
            self._progress()
            return slot

    def attach(self, slot: ThreadSlot) -> None:
        """Called first in the new thread: wait for its first turn."""
        with self._lock:
            slot.ident = threading.get_ident()
            self._by_ident[slot.ident] = slot
            self._park(slot)

    def finish(self, slot: ThreadSlot) -> None:
        """Called last in a controlled thread: it ends and passes the turn on (never raises)."""
        with self._lock:
            slot.state = FINISHED
            self._by_ident.pop(slot.ident, None)
            self._progress()
            self._wake(slot, True)  # its joiners
            if self._others_done():
                self._wake(self.all_done, True)
            if self.halt is None and self._running is slot:
                self._pass_turn(slot, f"{slot.label}.end")

    def release(self, slot: ThreadSlot) -> None:
        """An adopted thread leaves; the run is over."""
        with self._lock:
            slot.state = FINISHED
            self._by_ident.pop(slot.ident, None)
            self.closed = True
            self._running = None
            for other in self.threads:
                other.turn.notify_all()

    def others_done(self) -> bool:
        with self._lock:
            return self._others_done()

    def _others_done(self) -> bool:
        return all(t.finished for t in self.threads if t.ordinal not in self._adopted)

    def _new_slot(self, label: str) -> ThreadSlot:
        slot = ThreadSlot(len(self.threads), label, self._lock)
        self.threads.append(slot)
        return slot

    # -- operations of the running thread ----------------------------------------------------

    def controls_caller(self) -> bool:
        with self._lock:
            return threading.get_ident() in self._by_ident and not self._free()

    def point(self, label: str) -> None:
        """A scheduling point: the strategy may let another thread run first."""
        with self._lock:
            me = self._caller()
            if me is not None:
                self._switch(me, label)

    def block(self, label: str, on: object, timeout: float | None) -> object:
        """Wait until `wake(on, value)`; returns value, or None when `timeout` (virtual)
        expired first."""
        with self._lock:
            me = self._caller()
            if me is None:
                if self.halt is not None:
                    raise halted(self.halt)
                raise ScheduleMisuse(f"{label}: a blocking wait after the schedule ended")
            me.state, me.waiting_on, me.waiting_in = BLOCKED, on, label
            me.deadline = None if timeout is None else self.clock + max(0.0, timeout)
            me.wake_value = None
            self._switch(me, label)
            return me.wake_value

    def wake(self, on: object, value: object) -> None:
        """Make every thread blocked on `on` runnable; its wait returns `value`."""
        with self._lock:
            self._wake(on, value)

    # -- internals (holding the condition) ----------------------------------------------------

    def _free(self) -> bool:
        """Halted or over: operations no longer schedule."""
        return self.halt is not None or self.closed

    def _caller(self) -> ThreadSlot | None:
        """The calling thread's slot; None once the run is halted or over."""
        if self._free():
            return None
        slot = self._by_ident.get(threading.get_ident())
        if slot is None:
            raise ScheduleMisuse(f"thread {threading.current_thread().name!r} used a "
                                 f"controlled primitive but the schedule does not control it")
        return slot

    def _progress(self) -> None:
        self._idle_expiries = 0

    def _wake(self, on: object, value: object) -> None:
        for slot in self.threads:
            if slot.state == BLOCKED and slot.waiting_on is on:
                slot.state, slot.waiting_on, slot.waiting_in = RUNNABLE, None, ""
                slot.deadline, slot.wake_value = None, value
                self._progress()

    def _switch(self, me: ThreadSlot, label: str) -> None:
        self._pass_turn(me, label)
        if self._running is not me:
            self._park(me)

    def _pass_turn(self, me: ThreadSlot, label: str) -> None:
        """Choose who runs after `me`'s point and hand it the turn."""
        self.points += 1
        nxt = self._next(me, label)
        self._running = nxt
        if nxt is not None and nxt is not me:
            nxt.turn.notify()

    def _next(self, me: ThreadSlot, label: str) -> ThreadSlot | None:
        runnable = tuple(t.ordinal for t in self.threads if t.state == RUNNABLE)
        if not runnable:
            return self._expire(label)
        try:
            chosen = self._strategy.choose(self.points, me.ordinal, runnable)
        except ReplayMismatch as exc:
            self._halt_run("diverged", f"at {label} ({me.label}): {exc}")
            return None
        if chosen not in runnable:
            raise ValueError(f"strategy chose thread {chosen}, not one of {runnable}")
        if len(runnable) > 1:
            self.decisions.append(Decision(self.points, label, me.ordinal, runnable, chosen))
        return self.threads[chosen]

    def _expire(self, label: str) -> ThreadSlot | None:
        """Nobody can run: the earliest timed wait expires, or the run is deadlocked."""
        blocked = [t for t in self.threads if t.state in (BLOCKED, NEW)]
        if not blocked:
            return None
        timed = [t for t in blocked if t.state == BLOCKED and t.deadline is not None]
        self._idle_expiries += 1
        if not timed or self._idle_expiries > MAX_IDLE_EXPIRIES:
            why = ("no thread can run and none waits with a timeout" if not timed else
                   f"{MAX_IDLE_EXPIRIES} timeouts expired in a row and nothing else happened")
            self._halt_run("deadlock", f"at {label}: {why}")
            return None
        slot = min(timed, key=lambda t: (t.deadline, t.ordinal))
        self.clock = max(self.clock, slot.deadline or 0.0)
        slot.state, slot.waiting_on, slot.waiting_in = RUNNABLE, None, ""
        slot.deadline, slot.wake_value = None, None
        return slot

    def _park(self, me: ThreadSlot) -> None:
        """Wait for my turn (bounded by the safety deadline); raise if the run is halted."""
        limit = time.monotonic() + self.safety_s
        while self._running is not me and self.halt is None:
            left = limit - time.monotonic()
            if left <= 0:
                holder = self._running.label if self._running is not None else "nobody"
                self._halt_run("stuck", f"{me.label} waited {self.safety_s} s for its turn: "
                                        f"{holder} never reached a scheduling point")
                break
            me.turn.wait(left)
        if self.halt is not None:
            raise halted(self.halt)

    def _halt_run(self, kind: str, message: str) -> None:
        reports = tuple(ThreadReport(t.ordinal, t.label, t.state, t.waiting_in,
                                     stack_of(t.ident) if not t.finished else ())
                        for t in self.threads)
        self.halt = Halt(kind, message, reports)
        self._running = None
        for slot in self.threads:
            slot.turn.notify_all()
