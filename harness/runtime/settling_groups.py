"""Process groups a failed step left, kept alive until every wait that step began has ended.

Letting go of a gloo group destroys it on the spot, in ~ProcessGroupGloo, which waits for
the group's work thread while holding the GIL. A collective a failed step left in flight
ends on that thread at its timeout, and finishing it can need the GIL: the two then wait on
each other for good (seen in CI: a pytest worker parked in `SimWorld.run` with no CPU used).
A group is therefore let go only once it is quiet, and the process waits for the last ones
at exit, outside any destructor.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# Held at most: each held group keeps its threads and sockets, so a burst of failures waits
# for the oldest to go quiet rather than holding without bound.
MAX_HELD = 64


class SettlingGroups:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._held: list[tuple[float, Sequence[Any]]] = []  # (quiet from, the groups)

    def hold(self, groups: Sequence[Any], quiet_s: float) -> None:
        """Keep `groups` for `quiet_s` more seconds; let go of those already quiet."""
        self.release_quiet()
        with self._lock:
            first = min(u for u, _ in self._held) if len(self._held) >= MAX_HELD else None
        if first is not None:
            self._sleep(max(0.0, first - self._clock()))
            self.release_quiet()
        with self._lock:
            self._held.append((self._clock() + quiet_s, tuple(groups)))
        self.release_quiet()  # with no wait to settle, at once

    def release_quiet(self) -> None:
        with self._lock:
            now = self._clock()
            quiet = [groups for until, groups in self._held if until <= now]
            self._held = [(until, groups) for until, groups in self._held if until > now]
        del quiet  # destroyed here, outside the lock: no work of theirs is in flight

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def settle_all(self) -> None:
        """Wait (the GIL free) until every held group is quiet, then let all go."""
        with self._lock:
            last = max((until for until, _ in self._held), default=0.0)
        self._sleep(max(0.0, last - self._clock()))
        self.release_quiet()


SETTLING = SettlingGroups()
atexit.register(SETTLING.settle_all)  # before the interpreter's teardown destroys them
