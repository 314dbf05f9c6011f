"""One rank's step under a scenario's schedule (docs/schedules.md, "Scenarios, run and fuzz").

Each rank runs a scheduler of its own for the microbatch run of a step, the rank's thread
being thread 0; every rank and step take the scenario's schedule as it is (same seed), so a
scenario shrunk to one step or fewer ranks keeps the schedule each of its ranks ran. Under
`os` nothing is controlled and nothing recorded.

What a controlled step can end with besides the protocol's own result:

- a deadlock: `ScheduleDeadlockError`, a hang of the step (origin HANG, so the liveness
  checker reports it), in one line naming every unfinished thread, its wait and its
  innermost frame; found at once, no timeout spent;
- a run the scheduler could not control (a thread blocked outside the controlled primitives
  past `safety_s`, or a replay that diverged): `ScheduleCannot`, the harness's own failure
  (exit 3), raised on out of the step by `recorded` (never a finding).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.errors import ErrorOrigin, HarnessCannot
from harness.runtime.schedule.descriptor import Schedule
from harness.runtime.schedule.primitives import OS_PRIMITIVES, Primitives
from harness.runtime.schedule.records import Halt, ThreadReport
from harness.runtime.schedule.session import ScheduledRun

# The tail of a frame's path that names it: from the package on.
_PACKAGE_PATH = re.compile(r"(?:^|/)((?:vllm|harness|tests)/.*)$")


class ScheduleDeadlockError(RuntimeError):
    """The step's threads deadlocked under a controlled schedule."""

    origin = ErrorOrigin.HANG


class ScheduleCannot(HarnessCannot):
    """A controlled step the scheduler could not control (stuck, diverged)."""


@dataclass
class StepSchedule:
    """What the step's code makes its threads with, and (after) the choices it ran."""

    schedule: Schedule
    primitives: Primitives = OS_PRIMITIVES
    choices: tuple[int, ...] | None = None  # None under `os`


@contextmanager
def scheduled_step(schedule: Schedule, safety_s: float, label: str) -> Iterator[StepSchedule]:
    """The body runs its microbatch run with `.primitives`; `label` names thread 0."""
    step = StepSchedule(schedule)
    if not schedule.controlled:
        yield step
        return
    run = ScheduledRun(schedule, safety_s=safety_s, label=label)
    step.primitives = run.primitives
    try:
        with run:
            yield step
    except BaseException:  # the halt, or what it caused, or something else: see below
        halt = run.scheduler.halt if run.scheduler is not None else None
        if halt is None:
            raise
        # One line names every thread; the halt's full stacks stay out of the verdict.
        raise reported(halt, schedule) from None
    finally:
        trace = run.trace
        step.choices = trace.choices if trace is not None else ()


def reported(halt: Halt, schedule: Schedule) -> BaseException:
    """A halt as the step's error: a deadlock is a finding, the rest the harness's own."""
    under = f"under schedule {schedule.mode} seed {schedule.seed}"
    if halt.kind == "deadlock":
        threads = "; ".join(_thread_line(t) for t in halt.threads if t.state != "finished")
        return ScheduleDeadlockError(f"deadlock {under}: {threads}")
    return ScheduleCannot("schedule", f"{halt.kind} {under}: {halt.message}", halt.describe())


def _thread_line(thread: ThreadReport) -> str:
    where = f" in {thread.waiting_on}" if thread.waiting_on else ""
    frame = f" at {_short_frame(thread.stack[-1])}" if thread.stack else ""
    return f"thread {thread.ordinal} {thread.label!r} {thread.state}{where}{frame}"


def _short_frame(frame: str) -> str:
    """"/.../vllm/v1/worker/ubatching.py:120 in _cpu_yield" as
    "vllm/v1/worker/ubatching.py:120 (_cpu_yield)"."""
    where, _, function = frame.partition(" in ")
    match = _PACKAGE_PATH.search(where)
    return f"{match.group(1) if match else where} ({function})"


def recorded(exc: BaseException) -> BaseException:
    """`exc`, for a step to record as its error; one the harness could not control is
    raised on instead (HarnessCannot: exit 3, never a finding)."""
    if isinstance(exc, ScheduleCannot):
        raise exc
    return exc
