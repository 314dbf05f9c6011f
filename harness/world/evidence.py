"""Evidence of a failed world: every rank's Python stacks (faulthandler on SIGUSR1) and the
collective each was last in, read from the world's trace directory."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STACKS_WAIT_S = 1.0  # for every rank to dump its stacks on SIGUSR1


def rank_evidence(headline: str, trace_dir: Path, pids: dict[int, int], nproc: int) -> str:
    """Stacks of every rank and the tail of its collective trace, under `headline`."""
    stacks = {rank: trace_dir / f"stacks-{rank}.txt" for rank in range(nproc)}
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
    for rank in range(nproc):
        trace = trace_dir / f"collectives-{rank}.txt"
        tail = trace.read_text().splitlines()[-2:] if trace.exists() else []
        lines.append(f"rank {rank} trace tail: {' | '.join(tail) or 'none'}")
    for rank in range(nproc):
        text = stacks[rank].read_text() if stacks[rank].exists() else ""
        lines.append(f"--- rank {rank} stacks ---\n{text.strip() or '(none dumped)'}")
    return "\n".join(lines)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
