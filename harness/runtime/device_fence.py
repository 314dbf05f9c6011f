"""A bounded wait for the work a rank queued on its GPU.

A CUDA collective whose peer never joins keeps its kernel, and every stream that waits on
it, busy until the process ends (NCCL frees it only by aborting the communicator, which was
measured to hang: docs/worlds.md). A host read of a tensor behind it would never return, so
before a rank reads its results it waits for its streams with a bound; past it the device
is wedged, the step fails with `DeviceWedged`, and the rank touches the device no more (its
world is rebuilt after a failed step, which ends the process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from harness.errors import ErrorOrigin

POLL_S = 0.0002


class DeviceWedged(RuntimeError):
    """The rank's GPU work did not finish within its bound: a collective on it waits for a
    peer that never came. Only ending the process frees the device."""

    origin = ErrorOrigin.TIMEOUT


class _Event(Protocol):
    def query(self) -> bool: ...


def _cuda_event_on(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event


class DeviceFence:
    """Waits, bounded, for everything queued so far on `streams()` (raw torch.cuda streams)."""

    def __init__(self, streams: Callable[[], Sequence[torch.cuda.Stream]], timeout_s: float,
                 record: Callable[[torch.cuda.Stream], _Event] | None = None) -> None:
        """`record` marks the end of a stream's queued work (a CUDA event by default)."""
        self.streams = streams
        self.timeout_s = timeout_s
        self.record = record or _cuda_event_on
        self.wedged: str | None = None  # why the device can no longer be used

    def check(self) -> None:
        """Raise DeviceWedged if an earlier wait left the device held."""
        if self.wedged is not None:
            raise DeviceWedged(self.wedged)

    def wait(self, what: str) -> None:
        """Return when the streams are idle; raise DeviceWedged past the bound."""
        self.check()
        events = [self.record(stream) for stream in self.streams()]
        deadline = time.monotonic() + self.timeout_s
        while not all(e.query() for e in events):
            if time.monotonic() >= deadline:
                self.wedged = (f"{what}: the GPU work did not finish within "
                               f"{self.timeout_s:.1f} s (a collective waits for a peer that "
                               "never came); the device stays held until the process ends")
                raise DeviceWedged(self.wedged)
            time.sleep(POLL_S)
