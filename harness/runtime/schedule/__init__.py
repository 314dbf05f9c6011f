"""Deterministic schedules for a rank's microbatch threads (docs/schedules.md).

- `descriptor`: `Schedule`, the plain-data descriptor (mode, seed, pct depth, preemption
  bound, recorded choices), to and from JSON.
- `strategies`: who runs next at a scheduling point (random, PCT, non-preemptive, replay).
- `scheduler`: `Scheduler`, one thread at a time, virtual timeouts, deadlocks halted at once.
- `primitives`: `Primitives` a protocol makes its events, barriers and threads with; the real
  ones (`OS_PRIMITIVES`) or `ControlledPrimitives`.
- `session`: `ScheduledRun`, one run under a schedule from the thread that drives it.
- `explore`: many runs judged (random and pct series, exhaustive search with a bound).
- `bounded`: the numbered schedules one exhaustive run takes by its seed (run, fuzz).
- `step`: one rank's step under a scenario's schedule; a deadlock as the step's error.
- `records`, `errors`: what runs leave behind and what they raise.
"""

from harness.runtime.schedule.descriptor import CONTROLLED_MODES, MODES, OS_SCHEDULE, Schedule
from harness.runtime.schedule.errors import (
    ScheduleDeadlock,
    ScheduleDiverged,
    ScheduleHalted,
    ScheduleMisuse,
    ScheduleStuck,
)
from harness.runtime.schedule.explore import Exploration, Finding, explore, run_once
from harness.runtime.schedule.primitives import (
    OS_PRIMITIVES,
    BarrierLike,
    ControlledPrimitives,
    EventLike,
    OsPrimitives,
    Primitives,
)
from harness.runtime.schedule.records import Decision, Halt, ThreadReport, Trace
from harness.runtime.schedule.session import ScheduledRun

__all__ = [
    "CONTROLLED_MODES",
    "MODES",
    "OS_PRIMITIVES",
    "OS_SCHEDULE",
    "BarrierLike",
    "ControlledPrimitives",
    "Decision",
    "EventLike",
    "Exploration",
    "Finding",
    "Halt",
    "OsPrimitives",
    "Primitives",
    "Schedule",
    "ScheduleDeadlock",
    "ScheduleDiverged",
    "ScheduleHalted",
    "ScheduleMisuse",
    "ScheduleStuck",
    "ScheduledRun",
    "ThreadReport",
    "Trace",
    "explore",
    "run_once",
]
