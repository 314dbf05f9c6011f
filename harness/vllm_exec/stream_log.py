"""A rank's stream order on the CPU stand-in streams: every event record and wait, and every
write and read of the tensors the miniature hands between streams, each with the stream
current when it was issued, in one issue order (harness/check/stream_order.py judges it).

On CPU an op runs when it is issued, so a read on one stream of what another wrote gives the
right rows even with no event between them; the log keeps what a GPU would have raced on.
A replayed emulated graph logs again what its capture logged on the streams the capture
took in. Where the streams are real CUDA streams nothing is logged (the log is off).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.history.records import StreamOp
from harness.runtime.emulated_graph import EmulatedGraph


class StreamLog:
    """The issue order of one rank process; `current_stream` None: the log is off."""

    def __init__(self, current_stream: Callable[[], object] | None = None) -> None:
        self._current = current_stream
        self._ops: list[StreamOp] = []  # list.append is atomic: threads share it

    @property
    def on(self) -> bool:
        return self._current is not None

    def event(self, kind: str, stream: str, event: str) -> None:
        """An event's "record" or "wait" on `stream` (the stand-in events call this)."""
        if self.on:
            self._ops.append(StreamOp(kind, stream, event))

    def access(self, kind: str, tensor: str, op: str) -> None:
        """A "write" or "read" of `tensor` by `op` on the calling thread's current stream."""
        if self.on:
            self._ops.append(StreamOp(kind, self._current().name, tensor, op))

    def replayed(self, ops: tuple[StreamOp, ...]) -> None:
        """A graph's replay issues again what its capture logged, streams and events as
        captured (no Python runs at replay to log it)."""
        if self.on:
            self._ops.extend(ops)

    def mark(self) -> int:
        return len(self._ops)

    def since(self, mark: int) -> tuple[StreamOp, ...]:
        return tuple(self._ops[mark:])


OFF = StreamLog()


class LoggedGraph(EmulatedGraph):
    """An emulated graph whose every replay logs the stream order its capture logged on the
    streams the capture took in: what a launch of the graph issues, events as captured."""

    def __init__(self, stream_log: StreamLog, collective_timeout_s: float | None) -> None:
        super().__init__(collective_timeout_s)
        self._log = stream_log
        self.stream_order: tuple[StreamOp, ...] = ()

    def captured_order(self, logged: tuple[StreamOp, ...]) -> None:
        # Work issued meanwhile on a stream outside the capture ran then, not at replay.
        self.stream_order = tuple(op for op in logged if op.stream in self.streams)

    def replay(self) -> None:
        self._log.replayed(self.stream_order)
        super().replay()
