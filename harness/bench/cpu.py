"""CPU seconds spent by the processes of a bench row, so that `make bench` can print the
ceiling the machine's cores put on examples/s (cores / CPU seconds per example), whatever
the overlap."""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil


def cores() -> int:
    """The cores this process may run on (the bench's ceiling assumes all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds of these processes so far, all their threads included.
    A process that is gone raises: a row must not quietly count fewer ranks."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def ceiling_per_second(cpu_ms_per_example: float) -> float:
    """Examples/s if every core were busy with this row's work and nothing else."""
    return 1000 * cores() / cpu_ms_per_example if cpu_ms_per_example else 0.0
