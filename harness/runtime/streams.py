"""Streams and events with one interface: logical ones on CPU, torch.cuda ones on GPUs.

On CPU every op runs synchronously when issued, so a stream is only a name that a thread is
"on" and an event only needs its record/wait history. The emulated graph hooks in here: a
stream being captured carries a `CaptureSession`, and a thread that makes such a stream
current starts recording into it (dispatch modes are thread-local, so the thread must do it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch


class StreamError(RuntimeError):
    """A stream or event used against the rules (wrong runtime, wrong device)."""


class Recording(Protocol):
    """One thread's recording into a capture; stopped in the thread that started it."""

    def stop(self) -> None: ...


class CaptureSession(Protocol):
    """What an emulated capture needs to hear from the stream layer."""

    @property
    def is_active(self) -> bool: ...

    def start_recording(self, stream: LogicalStream) -> Recording: ...

    def event_recorded(self, stream: LogicalStream) -> object: ...

    def event_waited(self, token: object, stream: LogicalStream) -> None: ...


# ---------------------------------------------------------------------------------------------
# CPU: logical streams


class LogicalStream:
    """A named stream of one CPU runtime; `capture` is set while it is being captured."""

    def __init__(self, runtime: CpuStreams, name: str) -> None:
        self.runtime = runtime
        self.name = name
        self.capture: CaptureSession | None = None

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def record_event(self, event: LogicalEvent | None = None) -> LogicalEvent:
        event = event if event is not None else self.runtime.new_event()
        event.record(self)
        return event

    def wait_event(self, event: LogicalEvent) -> None:
        event.wait(self)

    def wait_stream(self, other: LogicalStream) -> None:
        self.wait_event(other.record_event())

    def __repr__(self) -> str:
        return f"LogicalStream({self.name!r})"


class LogicalEvent:
    """An event ordered by issue order; counts are kept for stream-hygiene checks."""

    def __init__(self, runtime: CpuStreams, name: str) -> None:
        self.runtime = runtime
        self.name = name
        self.num_records = 0
        self.num_waits = 0
        # Waiting on a never-recorded event is a silent no-op on CUDA: almost always a bug.
        self.num_unrecorded_waits = 0
        self.last_recorded_on: str | None = None
        self._capture_token: tuple[CaptureSession, object] | None = None

    def record(self, stream: LogicalStream | None = None) -> None:
        stream = self.runtime.resolve(stream)
        self.num_records += 1
        self.last_recorded_on = stream.name
        session = stream.capture
        if session is not None and session.is_active:
            self._capture_token = (session, session.event_recorded(stream))
        else:
            self._capture_token = None

    def wait(self, stream: LogicalStream | None = None) -> None:
        stream = self.runtime.resolve(stream)
        self.num_waits += 1
        if self.num_records == 0:
            self.num_unrecorded_waits += 1
        if self._capture_token is not None:
            session, token = self._capture_token
            if session.is_active:
                session.event_waited(token, stream)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for: CPU work is done when it was issued."""

    def __repr__(self) -> str:
        return f"LogicalEvent({self.name!r}, records={self.num_records}, waits={self.num_waits})"


class CpuStreams:
    """Logical streams of one CPU device; use one per rank, shared by that rank's threads."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.default_stream = LogicalStream(self, "default")
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._event_ids = itertools.count()
        # Which live threads sit on which stream: a capture must know who it cannot record.
        self._occupants: dict[LogicalStream, set[threading.Thread]] = {}

    def new_stream(self, name: str) -> LogicalStream:
        return LogicalStream(self, name)

    def new_event(self, name: str | None = None) -> LogicalEvent:
        return LogicalEvent(self, name or f"event-{next(self._event_ids)}")

    def current_stream(self) -> LogicalStream:
        return getattr(self._tls, "stream", self.default_stream)

    def set_current_stream(self, stream: LogicalStream) -> None:
        self._check_mine(stream)
        previous = self.current_stream()
        with self._lock:
            self._occupants.get(previous, set()).discard(threading.current_thread())
            self._occupants.setdefault(stream, set()).add(threading.current_thread())
        self._tls.stream = stream
        self._refresh_recording()

    @contextmanager
    def use(self, stream: LogicalStream) -> Iterator[LogicalStream]:
        """Run the block on `stream`, then return to whatever stream was current before."""
        previous = self.current_stream()
        self.set_current_stream(stream)
        try:
            yield stream
        finally:
            self.set_current_stream(previous)

    def synchronize(self) -> None:
        """Nothing to wait for on CPU."""

    def resolve(self, stream: LogicalStream | None) -> LogicalStream:
        stream = stream if stream is not None else self.current_stream()
        self._check_mine(stream)
        return stream

    # -- hooks for the emulated graph -----------------------------------------------------

    def other_threads_on(self, stream: LogicalStream) -> list[str]:
        """Names of live threads, other than the caller, whose current stream is `stream`."""
        me = threading.current_thread()
        with self._lock:
            occupants = list(self._occupants.get(stream, ()))
        return sorted(t.name for t in occupants if t is not me and t.is_alive())

    def attach_capture(self, stream: LogicalStream, session: CaptureSession) -> None:
        """Start capturing `stream`; the caller records at once if the stream is current."""
        self._check_mine(stream)
        stream.capture = session
        self._refresh_recording()

    def detach_capture(self, stream: LogicalStream) -> None:
        stream.capture = None
        self._refresh_recording()

    def _refresh_recording(self) -> None:
        # Stop the old recording before starting a new one: dispatch modes nest as a stack.
        recording = getattr(self._tls, "recording", None)
        if recording is not None:
            recording.stop()  # if this refuses, keep it: the next switch stops it
            self._tls.recording = None
        stream = self.current_stream()
        if stream.capture is not None and stream.capture.is_active:
            self._tls.recording = stream.capture.start_recording(stream)

    def _check_mine(self, stream: LogicalStream) -> None:
        if not isinstance(stream, LogicalStream) or stream.runtime is not self:
            raise StreamError(f"{stream!r} does not belong to this {self.device} runtime")


# ---------------------------------------------------------------------------------------------
# CUDA: thin wrappers with the same method names


class CudaStream:
    """A torch.cuda.Stream with a name; equal to any wrapper of the same raw stream."""

    def __init__(self, runtime: CudaStreams, raw: torch.cuda.Stream, name: str) -> None:
        self.runtime = runtime
        self.raw = raw
        self.name = name

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def record_event(self, event: CudaEvent | None = None) -> CudaEvent:
        event = event if event is not None else self.runtime.new_event()
        event.record(self)
        return event

    def wait_event(self, event: CudaEvent) -> None:
        event.wait(self)

    def wait_stream(self, other: CudaStream) -> None:
        self.raw.wait_stream(other.raw)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CudaStream) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"CudaStream({self.name!r})"


class CudaEvent:
    """A torch.cuda.Event with the same record/wait counts as the CPU event."""

    def __init__(self, runtime: CudaStreams, name: str) -> None:
        self.runtime = runtime
        self.name = name
        self.raw = torch.cuda.Event()
        self.num_records = 0
        self.num_waits = 0
        self.num_unrecorded_waits = 0
        self.last_recorded_on: str | None = None

    def record(self, stream: CudaStream | None = None) -> None:
        stream = self.runtime.resolve(stream)
        self.raw.record(stream.raw)
        self.num_records += 1
        self.last_recorded_on = stream.name

    def wait(self, stream: CudaStream | None = None) -> None:
        stream = self.runtime.resolve(stream)
        self.num_waits += 1
        if self.num_records == 0:
            self.num_unrecorded_waits += 1
        self.raw.wait(stream.raw)

    def query(self) -> bool:
        return self.raw.query()

    def synchronize(self) -> None:
        self.raw.synchronize()

    def __repr__(self) -> str:
        return f"CudaEvent({self.name!r}, records={self.num_records}, waits={self.num_waits})"


class CudaStreams:
    """torch.cuda streams of one device behind the CpuStreams interface."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.default_stream = CudaStream(
            self, torch.cuda.default_stream(self.device), "default")
        self._names: dict[torch.cuda.Stream, str] = {self.default_stream.raw: "default"}
        self._event_ids = itertools.count()

    def new_stream(self, name: str) -> CudaStream:
        raw = torch.cuda.Stream(self.device)
        self._names[raw] = name
        return CudaStream(self, raw, name)

    def all_raw(self) -> list[torch.cuda.Stream]:
        """Every stream made here and the calling thread's current one: the work a rank
        has queued on its device."""
        current = torch.cuda.current_stream(self.device)
        return list(self._names) + ([current] if current not in self._names else [])

    def new_event(self, name: str | None = None) -> CudaEvent:
        return CudaEvent(self, name or f"event-{next(self._event_ids)}")

    def current_stream(self) -> CudaStream:
        raw = torch.cuda.current_stream(self.device)
        return CudaStream(self, raw, self._names.get(raw, f"cuda-stream-{raw.stream_id}"))

    def set_current_stream(self, stream: CudaStream) -> None:
        torch.cuda.set_stream(stream.raw)

    @contextmanager
    def use(self, stream: CudaStream) -> Iterator[CudaStream]:
        with torch.cuda.stream(stream.raw):
            yield stream

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def resolve(self, stream: CudaStream | None) -> CudaStream:
        return stream if stream is not None else self.current_stream()


Streams = CpuStreams | CudaStreams


def make_streams(device: torch.device | str) -> Streams:
    """The stream runtime for `device`: logical streams on CPU, torch.cuda ones on CUDA."""
    device = torch.device(device)
    if device.type == "cpu":
        return CpuStreams(device)
    if device.type == "cuda":
        return CudaStreams(device)
    raise StreamError(f"no stream runtime for device type {device.type!r}")
