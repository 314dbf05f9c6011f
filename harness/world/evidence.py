"""Evidence of a failed world: every rank's Python stacks (faulthandler on SIGUSR1) and the
collective each was last in, read from the world's trace directory."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from harness.world.trace_layout import TraceLayout

STACKS_WAIT_S = 1.0  # for every rank to dump its stacks on SIGUSR1
FATAL_PREFIX = "Fatal Python error: "  # faulthandler's first line on a fatal signal


def rank_evidence(headline: str, trace_dir: Path, pids: dict[int, int], nproc: int,
                  ranks: list[int] | None = None) -> str:
    """Stacks of every rank (of `ranks`, when given: those of one node) and the tail of its
    collective trace, under `headline`."""
    ranks = list(range(nproc)) if ranks is None else ranks
    layout = TraceLayout(trace_dir)
    stacks = {rank: layout.stacks(rank) for rank in ranks}
    before = {rank: _size(path) for rank, path in stacks.items()}
    asked = []
    for rank, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
            asked.append(rank)
        except ProcessLookupError:
            pass
    # faulthandler writes from its signal handler, GIL or not; give it a moment.
    deadline = time.monotonic() + STACKS_WAIT_S
    while (time.monotonic() < deadline
           and any(_size(stacks[r]) <= before[r] for r in asked)):
        time.sleep(0.02)
    time.sleep(0.05)  # the last lines of a dump that has begun
    lines = [headline]
    for rank in ranks:
        trace = layout.collectives(rank)
        tail = trace.read_text().splitlines()[-2:] if trace.exists() else []
        lines.append(f"rank {rank} trace tail: {' | '.join(tail) or 'none'}")
    for rank in ranks:
        text = stacks[rank].read_text() if stacks[rank].exists() else ""
        lines.append(f"--- rank {rank} stacks ---\n{text.strip() or '(none dumped)'}")
    return "\n".join(lines)


def fatal_error(trace_dir: Path, rank: int) -> str | None:
    """How the rank's process died, as faulthandler wrote it ("Aborted", "Segmentation
    fault"), or None when it did not die of a fatal signal."""
    stacks = TraceLayout(trace_dir).stacks(rank)
    if not stacks.exists():
        return None
    for line in stacks.read_text(errors="replace").splitlines():
        if line.startswith(FATAL_PREFIX):
            return line.removeprefix(FATAL_PREFIX).strip()
    return None


def last_collective(trace_dir: Path, rank: int) -> str | None:
    """The last collective the rank issued in its latest step ("all_to_all [258, 19]
    float64"), from its trace; None when that step issued none."""
    trace = TraceLayout(trace_dir).collectives(rank)
    lines = trace.read_text().splitlines() if trace.exists() else []
    step_start = max((i for i, line in enumerate(lines) if line.startswith("-- ")), default=-1)
    issued = [line for line in lines[step_start + 1:] if line.startswith("#")]
    return issued[-1].split(" ", 1)[1] if issued else None


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def native_abort_message(text: str) -> str | None:
    """What a native library said as it aborted the process, from its stderr: C++'s
    "terminate called after throwing an instance of 'T'" then "what(): M", as "T: M"."""
    kind, what = None, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("terminate called after throwing an instance of "):
            kind = line.removeprefix("terminate called after throwing an instance of ")
            kind = kind.strip("'")
        elif line.startswith("what():") and what is None:
            what = line.removeprefix("what():").strip()
    if what is None:
        return None
    return f"{kind}: {what}" if kind else what
