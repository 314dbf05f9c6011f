"""`ScheduledRun`: one run of a protocol under a `Schedule`, from the thread that drives it.

    with ScheduledRun(schedule) as run:
        ...  # build the protocol with run.primitives, start its threads, finish it
    run.trace  # every choice made (run.trace.schedule replays it), and any halt

Under `os` the primitives are `threading`'s and nothing is recorded. Under a controlled mode
the calling thread is adopted as thread 0 and holds the turn; leaving the block waits (under
the schedule) for every thread it started to end, so a hang is found there too.
"""

from __future__ import annotations

import time

from harness.runtime.schedule.descriptor import Schedule
from harness.runtime.schedule.errors import ScheduleHalted, halted
from harness.runtime.schedule.primitives import (
    OS_PRIMITIVES,
    ControlledPrimitives,
    Primitives,
)
from harness.runtime.schedule.records import Trace
from harness.runtime.schedule.scheduler import Scheduler, ThreadSlot
from harness.runtime.schedule.strategies import strategy_for

DEFAULT_SAFETY_S = 60.0


class ScheduledRun:
    def __init__(self, schedule: Schedule, *, safety_s: float = DEFAULT_SAFETY_S,
                 label: str = "main") -> None:
        self.schedule = schedule
        self.label = label
        self.scheduler: Scheduler | None = None
        self.primitives: Primitives = OS_PRIMITIVES
        if schedule.controlled:
            self.scheduler = Scheduler(strategy_for(schedule), safety_s)
            self.primitives = ControlledPrimitives(self.scheduler)
        self._slot: ThreadSlot | None = None

    def __enter__(self) -> ScheduledRun:
        if self.scheduler is not None:
            if self._slot is not None or self.scheduler.closed:
                raise RuntimeError("a ScheduledRun runs once")
            self._slot = self.scheduler.adopt(self.label)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        sched, slot = self.scheduler, self._slot
        if sched is None or slot is None:
            return
        try:
            if sched.halt is None and not sched.others_done():
                sched.block(f"{self.label}: end of run", sched.all_done, None)
        except ScheduleHalted:
            pass  # raised below, unless something else is already on its way out
        finally:
            sched.release(slot)
            self._join_threads()
        if sched.halt is not None and exc is None:
            raise halted(sched.halt)

    def _join_threads(self) -> None:
        """Every thread ended under the schedule, or is unwinding from a halt: bounded."""
        assert isinstance(self.primitives, ControlledPrimitives)
        limit = time.monotonic() + self.primitives.scheduler.safety_s
        for thread in self.primitives.threads:
            if thread.slot is not None:  # one made but never started has nothing to join
                thread.join(max(0.0, limit - time.monotonic()))

    @property
    def trace(self) -> Trace | None:
        """The run's record (None under `os`)."""
        sched = self.scheduler
        if sched is None:
            return None
        decisions = tuple(sched.decisions)
        return Trace(schedule=self.schedule.with_choices(tuple(d.chosen for d in decisions)),
                     decisions=decisions, points=sched.points, clock=sched.clock,
                     halt=sched.halt, threads=tuple(t.label for t in sched.threads))
