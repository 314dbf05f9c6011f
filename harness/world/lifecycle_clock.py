"""What a world's life cycle cost: each launch (the first one cold, later ones relaunches
after a failure), each soft regroup, each end after a
failure. Read by `make bench`'s rebuild rows and by the distributed suite's closing table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class LifecycleClock:
    starts: list[float] = field(default_factory=list)  # seconds per launch, first one cold
    regroups: list[float] = field(default_factory=list)  # a fresh group, same processes
    ends: list[float] = field(default_factory=list)  # a world ended after a failure

    @contextmanager
    def timing(self, into: list[float]) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            into.append(time.monotonic() - start)

    @property
    def relaunches(self) -> list[float]:
        return self.starts[1:]

    def totals(self) -> dict[str, tuple[int, float]]:
        """(count, seconds) for each kind of event, in the order a table prints them."""
        return {"cold start": (len(self.starts[:1]), sum(self.starts[:1])),
                "relaunch": (len(self.relaunches), sum(self.relaunches)),
                "end after a failure": (len(self.ends), sum(self.ends)),
                "soft regroup": (len(self.regroups), sum(self.regroups))}
