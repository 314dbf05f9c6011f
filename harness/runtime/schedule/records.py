"""What a controlled run leaves behind: its decisions, and why it was halted, if it was."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from harness.runtime.schedule.descriptor import Schedule

_OWN_DIR = str(Path(__file__).resolve().parent)
_STACK_DEPTH = 12  # innermost frames kept per thread


@dataclass(frozen=True)
class Decision:
    """A scheduling point where two or more threads could run, and who was chosen."""

    step: int  # the scheduling point's number in the run
    label: str  # the operation at the point ("ring[1].set", "ub0.yield", ...)
    at: int  # the thread at the point
    candidates: tuple[int, ...]  # the threads that could run, ascending
    chosen: int

    @property
    def preemptive(self) -> bool:
        """The thread at the point could go on, and another was chosen."""
        return self.at in self.candidates and self.chosen != self.at


@dataclass(frozen=True)
class ThreadReport:
    ordinal: int
    label: str
    state: str  # runnable, blocked, finished, not started
    waiting_on: str  # the operation it is blocked in ("" unless blocked)
    stack: tuple[str, ...]  # "file:line in function", outermost first, scheduler frames cut

    def describe(self) -> str:
        where = f" in {self.waiting_on}" if self.waiting_on else ""
        lines = [f"thread {self.ordinal} {self.label!r}: {self.state}{where}"]
        return "\n".join([*lines, *(f"    {frame}" for frame in self.stack)])


@dataclass(frozen=True)
class Halt:
    kind: str  # deadlock, stuck, diverged
    message: str
    threads: tuple[ThreadReport, ...]

    def describe(self) -> str:
        return "\n".join([f"{self.kind.upper()}: {self.message}",
                          *(t.describe() for t in self.threads)])


@dataclass(frozen=True)
class Trace:
    """One controlled run: `schedule.choices` is every choice made, so it replays the run."""

    schedule: Schedule
    decisions: tuple[Decision, ...]
    points: int
    clock: float  # the virtual clock at the end
    halt: Halt | None
    threads: tuple[str, ...]  # labels by thread number

    @property
    def choices(self) -> tuple[int, ...]:
        return tuple(d.chosen for d in self.decisions)

    @property
    def preemptions(self) -> int:
        return sum(d.preemptive for d in self.decisions)


def stack_of(ident: int | None) -> tuple[str, ...]:
    """The live stack of thread `ident`, without this package's frames."""
    frame: FrameType | None = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return ()
    entries = traceback.extract_stack(frame)
    own = [i for i, e in enumerate(entries) if e.filename.startswith(_OWN_DIR)]
    # Past the scheduler's innermost frame is only the condition it parks on.
    inner = own[-1] if own else len(entries)
    frames = [e for e in entries[:inner] if not e.filename.startswith(_OWN_DIR)]
    return tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-_STACK_DEPTH:])
