"""A CPU stand-in for CUDA graph capture: record the ops issued on the capturing stream(s),
replay them on the same storage.

Faithful where it matters to the harness: control flow and shapes are frozen at capture;
inputs are read from, and outputs written to, storage fixed at capture; work issued on a
stream that is not capturing is not recorded; a host sync invalidates the capture; a stream
that joined the capture through an event must be joined back before the capture ends.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from harness.runtime.graph_lifecycle import CaptureError, GraphState, LifecycleGraph
from harness.runtime.op_record import CollectiveCall, RecordedOp, record_op, snapshot_args
from harness.runtime.replay_program import Step, compile_trace, run_program
from harness.runtime.streams import CpuStreams, LogicalStream

_aten = torch.ops.aten

# Ops whose result the host must wait for: a CUDA graph capture cannot contain them.
HOST_SYNC_OPS = frozenset({
    _aten._local_scalar_dense.default,  # .item(), bool(t), int(t)
    _aten.nonzero.default,  # output size depends on the data
    _aten.masked_select.default,
    _aten.equal.default,  # returns a Python bool
    _aten._unique2.default,
})

_MASKS = (torch.bool, torch.uint8)


def is_host_sync(func, args: tuple) -> bool:
    """Whether the host must wait for `func`'s result (or size) on a GPU."""
    if func in HOST_SYNC_OPS:
        return True
    # Reading through a boolean mask sizes the result by the data (measured: fails capture on
    # an H200). Mask assignment is not flagged: `x[m] = 0.` becomes masked_fill_ on CUDA.
    if func is _aten.index.Tensor:
        return any(i is not None and i.dtype in _MASKS for i in args[1])
    return False


# On CPU these never reach the dispatcher (there is nothing to copy), so they are caught
# as Python calls instead; on a GPU each is a device-to-host copy.
HOST_SYNC_METHODS = frozenset({torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy})

EMPTY_GRAPH_WARNING = "The emulated CUDA Graph is empty: the capture recorded no ops"


class _SyncGuard(TorchFunctionMode):
    def __init__(self, session: _CaptureSession, stream: LogicalStream) -> None:
        super().__init__()
        self.session = session
        self.stream = stream

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNC_METHODS and self.session.is_active:
            self.session.host_sync(f"Tensor.{func.__name__}()", self.stream)
        return func(*args, **(kwargs or {}))


class _OpRecorder(TorchDispatchMode):
    def __init__(self, session: _CaptureSession, stream: LogicalStream) -> None:
        super().__init__()
        self.session = session
        self.stream = stream

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing here runs under torch.compile; torch's default wraps the handler in a
        # dynamo guard whose first call imports torch._dynamo (over a second on CPU).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A capture that ended in another thread leaves this mode in place until we switch.
        if not self.session.is_active:
            return func(*args, **kwargs)
        if is_host_sync(func, args):
            self.session.host_sync(str(func), self.stream)
        slots, spec = snapshot_args(args, kwargs)
        results = func(*args, **kwargs)
        self.session.append(
            record_op(func, slots, spec, results, self.stream.name,
                      threading.current_thread().name),
            self.stream)
        return results


class _ThreadRecording:
    """Both modes of one thread; started and stopped by the stream layer in that thread."""

    def __init__(self, session: _CaptureSession, stream: LogicalStream) -> None:
        self._modes = (_SyncGuard(session, stream), _OpRecorder(session, stream))

    def start(self) -> _ThreadRecording:
        for mode in self._modes:
            mode.__enter__()
        return self

    def stop(self) -> None:
        # Mode exit pops whatever is on top: refuse rather than pop someone else's mode.
        guard, recorder = self._modes
        if (_get_current_dispatch_mode() is not recorder
                or _get_current_function_mode() is not guard):
            raise CaptureError("switched streams while a torch mode entered after the switch "
                               "onto the capturing stream was still active")
        recorder.__exit__(None, None, None)
        guard.__exit__(None, None, None)


class _CaptureSession:
    """One capture in progress: its member streams and what each has seen of the others.

    Each member stream keeps a vector clock (ops seen per stream) so that the capture can
    tell, at the end, whether every stream it forked into was joined back to the origin.
    """

    def __init__(self, graph: EmulatedGraph, streams: CpuStreams,
                 origin: LogicalStream) -> None:
        self.graph = graph
        self.streams = streams
        self.origin = origin
        self._lock = threading.Lock()
        self._active = True
        self._ops_on: dict[LogicalStream, int] = {origin: 0}
        self._clock: dict[LogicalStream, dict[LogicalStream, int]] = {origin: {}}

    @property
    def is_active(self) -> bool:
        return self._active

    def start_recording(self, stream: LogicalStream) -> _ThreadRecording:
        return _ThreadRecording(self, stream).start()

    def append(self, op: RecordedOp, stream: LogicalStream) -> None:
        with self._lock:
            self.graph._ops.append(op)
            self._ops_on[stream] += 1

    def host_sync(self, what: str, stream: LogicalStream) -> None:
        reason = (f"host sync {what} on thread {threading.current_thread().name!r} "
                  f"(stream {stream.name!r}) during capture")
        self.graph._lifecycle.invalidate(reason)
        raise CaptureError(reason)

    def event_recorded(self, stream: LogicalStream) -> dict[LogicalStream, int]:
        with self._lock:
            return {**self._clock[stream], stream: self._ops_on[stream]}

    def event_waited(self, token: object, stream: LogicalStream) -> None:
        with self._lock:
            joining = stream not in self._ops_on
            if joining:
                self._ops_on[stream] = 0
                self._clock[stream] = {}
            clock = self._clock[stream]
            for member, seen in token.items():
                clock[member] = max(clock.get(member, -1), seen)
        if joining:
            # Waiting on a captured event pulls the stream into the capture (a fork).
            others = self.streams.other_threads_on(stream)
            if others:
                reason = (f"stream {stream.name!r} joined the capture while threads {others} "
                          "sat on it; the emulation records only threads that switch onto "
                          "a capturing stream")
                self.graph._lifecycle.invalidate(reason)
                raise CaptureError(reason)
            self.streams.attach_capture(stream, self)

    def member_names(self) -> frozenset[str]:
        """The streams that took part in the capture: its origin and every stream it forked."""
        with self._lock:
            return frozenset(s.name for s in self._ops_on)

    def unjoined(self) -> list[str]:
        """Forked streams whose last work the origin stream never waited for."""
        seen = self._clock[self.origin]
        return sorted(s.name for s, n in self._ops_on.items()
                      if s is not self.origin and seen.get(s, -1) < n)

    def close(self) -> None:
        self._active = False
        for stream in list(self._ops_on):
            self.streams.detach_capture(stream)


class EmulatedGraph(LifecycleGraph):
    """A recorded op sequence; `replay()` issues it again on the storage fixed at capture."""

    def __init__(self, collective_timeout_s: float | None = None) -> None:
        super().__init__()
        self._ops: list[RecordedOp] = []
        self._program: tuple[Step, ...] | None = None  # built at the first replay
        self.streams: frozenset[str] = frozenset()  # the streams its capture took in
        self.collective_timeout_s = collective_timeout_s

    @property
    def ops(self) -> tuple[RecordedOp, ...]:
        return tuple(self._ops)

    @property
    def num_ops(self) -> int:
        return len(self._ops)

    @property
    def is_empty(self) -> bool:
        """True once a capture has ended having recorded nothing."""
        return self.state is GraphState.CAPTURED and not self._ops

    def op_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self._ops)

    def collectives(self) -> tuple[CollectiveCall, ...]:
        return tuple(op.collective() for op in self._ops if op.is_collective)

    def replay(self) -> None:
        self._lifecycle.check_replayable()
        if self._program is None:
            self._program = compile_trace(self._ops, self.collective_timeout_s)
        with torch.no_grad():
            run_program(self._program)


class EmulatedPool:
    """Stands in for a memory pool handle: the emulated graph holds its storage itself."""


class EmulatedGraphs:
    """The emulated graph backend over one rank's CPU streams."""

    def __init__(self, streams: CpuStreams, collective_timeout_s: float | None = None) -> None:
        self.streams = streams
        self.collective_timeout_s = collective_timeout_s

    def new_pool(self) -> EmulatedPool:
        return EmulatedPool()

    def new_graph(self) -> EmulatedGraph:
        return EmulatedGraph(self.collective_timeout_s)

    @contextmanager
    def capture(self, graph: EmulatedGraph, stream: LogicalStream,
                pool: EmulatedPool | None = None) -> Iterator[EmulatedGraph]:
        """Record what is issued on `stream` (current in this thread meanwhile) into `graph`."""
        self._check_can_capture(stream)
        graph._lifecycle.begin()
        session = _CaptureSession(graph, self.streams, stream)
        previous = self.streams.current_stream()
        self.streams.attach_capture(stream, session)
        self.streams.set_current_stream(stream)
        try:
            yield graph
        except BaseException:
            self._end(session, previous, raised=True)
            raise
        self._end(session, previous, raised=False)
        if graph.failure is not None:
            raise CaptureError(f"capture invalidated: {graph.failure}")
        if graph.is_empty:
            warnings.warn(EMPTY_GRAPH_WARNING, UserWarning, stacklevel=3)

    def _check_can_capture(self, stream: LogicalStream) -> None:
        self.streams.resolve(stream)
        if stream is self.streams.default_stream:
            raise CaptureError("a graph must be captured on a non-default stream")
        if stream.capture is not None and stream.capture.is_active:
            raise CaptureError(f"stream {stream.name!r} is already being captured")
        others = self.streams.other_threads_on(stream)
        if others:
            raise CaptureError(
                f"threads {others} are already on stream {stream.name!r}; the emulation can "
                "record a thread only from when it switches onto a capturing stream")

    def _end(self, session: _CaptureSession, previous: LogicalStream, raised: bool) -> None:
        self.streams.set_current_stream(previous)
        unjoined = session.unjoined()
        session.graph.streams = session.member_names()
        session.close()
        if unjoined:
            session.graph._lifecycle.invalidate(
                f"streams {unjoined} forked from {session.origin.name!r} were not joined back")
        session.graph._lifecycle.end(raised)
