"""A rank's own word that its step ran past the step deadline (`StepOverdue`).

vLLM's microbatch waits have no bound, so a step of its execution code that parks a thread
for good never returns, and only the driver's deadline ends it: the step deadline plus the
slack a rank's message needs to cross a loaded machine (harness/timeouts.py). Liveness fails
a step at the step deadline whatever comes after it, so the rank says so at that moment and
the driver names the hang then; the slack is left to a rank that cannot speak (its
process wedged), which only the driver's own deadline catches.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from harness.world.channel import wire
from harness.world.channel.messages import StepOverdue


def waits_unbounded(runtime: object) -> bool:
    """A runtime whose step may wait forever (vLLM's execution code) gets the notice; the
    harness's own bounds every wait of its step and reports a hang in its record."""
    return bool(getattr(runtime, "waits_unbounded", False))


@contextlib.contextmanager
def overdue_notice(channel: wire.Channel, rank: int, index: int, deadline_s: float,
                   armed: bool = True) -> Iterator[None]:
    """Within the block, say StepOverdue once it has run `deadline_s` (when `armed`)."""
    if not armed:
        yield
        return

    finished, saying = False, threading.Lock()

    def say() -> None:
        with saying:  # never after the block: the notice is always before the step's report
            if not finished:
                with contextlib.suppress(wire.ChannelClosed):
                    channel.send(StepOverdue(rank, index, deadline_s))

    timer = threading.Timer(deadline_s, say)
    timer.daemon = True
    timer.name = f"step-watch-{index}"
    timer.start()
    try:
        yield
    finally:
        with saying:
            finished = True
        timer.cancel()
