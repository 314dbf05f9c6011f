"""What a controlled schedule raises when it stops a run (`ScheduleHalted` and its kinds), and
misuse of the controlled primitives."""

from __future__ import annotations

from harness.errors import ErrorOrigin
from harness.runtime.schedule.records import Halt


class ScheduleHalted(BaseException):
    """The scheduler stopped the run; raised in every controlled thread at its next wait.

    A BaseException, so that a body catching Exception cannot swallow it and wait again."""

    def __init__(self, halt: Halt) -> None:
        super().__init__(halt.describe())
        self.halt = halt


class ScheduleDeadlock(ScheduleHalted):
    """No thread can run and none waits with a timeout: a hang of the protocol under test."""

    origin = ErrorOrigin.HANG  # what a thread that recorded it was released by


class ScheduleStuck(ScheduleHalted):
    """A thread kept the turn past the safety bound without reaching a scheduling point (it
    blocked outside the controlled primitives): the harness could not control this run."""


class ScheduleDiverged(ScheduleHalted):
    """A replayed choice names a thread that cannot run there: the run is not the recorded
    one (the code or its inputs changed, or it depends on something the schedule does not
    control)."""


class ScheduleMisuse(RuntimeError):
    """A controlled primitive was used from a thread the scheduler does not control."""


HALTS: dict[str, type[ScheduleHalted]] = {
    "deadlock": ScheduleDeadlock, "stuck": ScheduleStuck, "diverged": ScheduleDiverged}


def halted(halt: Halt) -> ScheduleHalted:
    """A fresh exception for `halt` (one per thread: tracebacks are per instance)."""
    return HALTS[halt.kind](halt)
