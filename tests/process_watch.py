"""Which processes of a test are still running (zombies count as gone), with a bound."""

from __future__ import annotations

import time

import psutil


def alive(pids) -> list[int]:
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def gone_within(pids, seconds: float) -> list[int]:
    """The pids still running after waiting up to `seconds` for all of them to end."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)
