"""The handoff primitives a protocol makes its threads with, real or under a schedule.

`OS_PRIMITIVES` hands out `threading`'s own objects (the `os` schedule: unchanged behaviour).
`ControlledPrimitives` hands out stand-ins with the same methods whose every handoff is a
scheduling point: `Event.set` (before and after: the woken thread may run at once), `wait`
and `clear`; `Barrier.wait` (and after the last arrival), `abort`; `Thread.start` and `join`;
and `point(label)` for the protocol's own handoffs (yields, recv hooks, stream switches).
`Event.is_set` and `Barrier.broken` are plain reads. Timeouts are virtual (scheduler.py):
a wait may time out only when no other thread can run, and `monotonic()` reads that clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from harness.runtime.schedule.errors import ScheduleHalted
from harness.runtime.schedule.scheduler import Scheduler, ThreadSlot


class EventLike(Protocol):
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class BarrierLike(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...
    def abort(self) -> None: ...
    @property
    def broken(self) -> bool: ...


class Primitives(Protocol):
    def event(self, name: str) -> EventLike: ...
    def barrier(self, parties: int, name: str) -> BarrierLike: ...
    def thread(self, target: Callable[..., Any], name: str, args: Sequence[Any] = (),
               daemon: bool = True) -> threading.Thread: ...
    def point(self, label: str) -> None: ...
    def monotonic(self) -> float: ...


class OsPrimitives:
    """`threading` itself; `point` does nothing."""

    def event(self, name: str) -> threading.Event:
        return threading.Event()

    def barrier(self, parties: int, name: str) -> threading.Barrier:
        return threading.Barrier(parties)

    def thread(self, target: Callable[..., Any], name: str, args: Sequence[Any] = (),
               daemon: bool = True) -> threading.Thread:
        return threading.Thread(target=target, name=name, args=tuple(args), daemon=daemon)

    def point(self, label: str) -> None:
        return None

    def monotonic(self) -> float:
        return time.monotonic()


OS_PRIMITIVES = OsPrimitives()


class ControlledEvent:
    def __init__(self, scheduler: Scheduler, name: str) -> None:
        self._sched = scheduler
        self.name = name
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        self._sched.wake(self, True)
        self._sched.point(f"{self.name}.set")  # after: a woken waiter may run at once

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        polls = timeout is not None and timeout <= 0
        if self._flag or polls:  # a wait that would block is a switch of its own
            self._sched.point(f"{self.name}.wait")
        if self._flag:
            return True
        if polls:
            return False
        # Woken by set(): True even if cleared before this thread runs, as threading's.
        return self._sched.block(f"{self.name}.wait", self, timeout) is True


class _Generation:
    """One filling of a barrier: what its waiters are blocked on."""


class ControlledBarrier:
    def __init__(self, scheduler: Scheduler, parties: int, name: str) -> None:
        if parties < 1:
            raise ValueError(f"a barrier needs at least 1 party, got {parties}")
        self._sched = scheduler
        self.name = name
        self.parties = parties
        self._count = 0
        self._broken = False
        self._generation = _Generation()

    @property
    def broken(self) -> bool:
        return self._broken

    @property
    def n_waiting(self) -> int:
        return self._count

    def wait(self, timeout: float | None = None) -> int:
        # A scheduling point when it releases the others (after), else it blocks (a switch).
        if self._broken:
            raise threading.BrokenBarrierError
        index = self._count
        self._count += 1
        generation = self._generation
        if self._count == self.parties:
            self._count = 0
            self._generation = _Generation()
            self._sched.wake(generation, True)
            self._sched.point(f"{self.name}.release")
            return index
        result = self._sched.block(f"{self.name}.wait", generation, timeout)
        if result is None:  # timed out: it breaks the barrier for everyone, as threading's
            self._break()
        if result is not True:
            raise threading.BrokenBarrierError
        return index

    def abort(self) -> None:
        self._sched.point(f"{self.name}.abort")
        self._break()

    def reset(self) -> None:
        """As threading's: waiters (if any) get BrokenBarrierError, then the barrier is whole
        and empty again. A point only when it woke someone (#55586's unwind resets it)."""
        woken = self._count > 0
        if woken:
            self._sched.wake(self._generation, False)
        self._count = 0
        self._broken = False
        self._generation = _Generation()
        if woken:
            self._sched.point(f"{self.name}.reset")

    def _break(self) -> None:
        self._broken = True
        self._sched.wake(self._generation, False)


class ControlledThread(threading.Thread):
    """A real thread that runs only when the scheduler gives it the turn. `is_alive` is the
    scheduler's view (deterministic); `join` from a controlled thread is a controlled wait."""

    def __init__(self, scheduler: Scheduler, target: Callable[..., Any], name: str,
                 args: Sequence[Any], daemon: bool) -> None:
        super().__init__(name=name, daemon=daemon)
        self._sched = scheduler
        self._body = target
        self._body_args = tuple(args)
        self.slot: ThreadSlot | None = None

    def start(self) -> None:
        self.slot = self._sched.register(self.name)
        super().start()
        self._sched.point(f"{self.name}.start")

    def run(self) -> None:
        assert self.slot is not None
        try:
            self._sched.attach(self.slot)
            self._body(*self._body_args)
        except ScheduleHalted:
            pass  # the scheduler holds the report; the run's driver raises it
        finally:
            self._sched.finish(self.slot)

    def join(self, timeout: float | None = None) -> None:
        slot = self.slot
        if slot is None or not self._sched.controls_caller():
            super().join(self._sched.safety_s if timeout is None else timeout)
            return
        if slot.finished:
            self._sched.point(f"join {self.name}")
        elif self._sched.block(f"join {self.name}", slot, timeout) is None:
            return  # timed out (virtually): the thread is still alive
        super().join(self._sched.safety_s)  # ended under the schedule: its real end is near

    def is_alive(self) -> bool:
        if self.slot is None:
            return super().is_alive()
        return not self.slot.finished


class ControlledPrimitives:
    """Primitives whose handoffs the scheduler controls."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.threads: list[ControlledThread] = []  # joined when the run ends

    def event(self, name: str) -> ControlledEvent:
        return ControlledEvent(self.scheduler, name)

    def barrier(self, parties: int, name: str) -> ControlledBarrier:
        return ControlledBarrier(self.scheduler, parties, name)

    def thread(self, target: Callable[..., Any], name: str, args: Sequence[Any] = (),
               daemon: bool = True) -> ControlledThread:
        thread = ControlledThread(self.scheduler, target, name, args, daemon)
        self.threads.append(thread)
        return thread

    def point(self, label: str) -> None:
        self.scheduler.point(label)

    def monotonic(self) -> float:
        return self.scheduler.clock
