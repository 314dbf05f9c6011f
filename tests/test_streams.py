"""Logical streams and events on CPU, the same interface over torch.cuda, and the capture hook."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.runtime.streams import (
    CpuStreams,
    CudaStreams,
    LogicalStream,
    StreamError,
    make_streams,
)
from harness.world.sim.threads import run_in_threads


def needs_cuda(test):
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(skip(test))


class FakeSession:
    """A capture session that only logs which thread started and stopped recording where."""

    def __init__(self) -> None:
        self.is_active = True
        self.log: list[tuple[str, str, str]] = []

    def start_recording(self, stream: LogicalStream):
        thread = threading.current_thread().name
        self.log.append(("start", thread, stream.name))
        session = self

        class Recording:
            def stop(self) -> None:
                session.log.append(("stop", thread, stream.name))

        return Recording()

    def event_recorded(self, stream):
        return stream.name

    def event_waited(self, token, stream):
        self.log.append(("waited", token, stream.name))


def test_a_new_thread_starts_on_the_default_stream_whatever_the_parent_is_on():
    streams = CpuStreams()
    side = streams.new_stream("side")
    streams.set_current_stream(side)
    try:
        [seen] = run_in_threads(1, lambda _: streams.current_stream(), deadline_s=5)
    finally:
        streams.set_current_stream(streams.default_stream)
    assert seen is streams.default_stream
    assert streams.current_stream() is streams.default_stream


def test_using_a_stream_makes_it_current_and_then_restores_the_previous_one():
    streams = CpuStreams()
    a, b = streams.new_stream("a"), streams.new_stream("b")
    with streams.use(a):
        with streams.use(b):
            assert streams.current_stream() is b
        assert streams.current_stream() is a
    assert streams.current_stream() is streams.default_stream


def test_each_thread_has_its_own_current_stream():
    streams = CpuStreams()
    mine = [streams.new_stream(f"s{r}") for r in range(2)]
    both_set = threading.Barrier(2, timeout=5)

    def body(rank: int) -> str:
        streams.set_current_stream(mine[rank])
        both_set.wait()  # the other thread has switched too: it must not have moved us
        return streams.current_stream().name

    assert run_in_threads(2, body, deadline_s=5) == ["s0", "s1"]


def test_events_count_records_and_waits_and_flag_a_wait_on_an_unrecorded_event():
    streams = CpuStreams()
    compute, comm = streams.new_stream("compute"), streams.new_stream("comm")
    event = streams.new_event("done")
    event.wait(comm)
    compute.record_event(event)
    comm.wait_event(event)
    assert (event.num_records, event.num_waits, event.num_unrecorded_waits) == (1, 2, 1)
    assert event.last_recorded_on == "compute"
    assert event.query()


def test_record_and_wait_without_a_stream_use_the_calling_threads_current_stream():
    streams = CpuStreams()
    session = FakeSession()
    compute, comm = streams.new_stream("compute"), streams.new_stream("comm")
    event = streams.new_event()
    streams.attach_capture(compute, session)
    try:
        with streams.use(compute):
            event.record()
        with streams.use(comm):
            event.wait()
    finally:
        streams.detach_capture(compute)
    assert event.last_recorded_on == "compute"
    assert ("waited", "compute", "comm") in session.log


def test_wait_stream_orders_a_stream_after_the_other_by_recording_an_event_on_it():
    streams = CpuStreams()
    session = FakeSession()
    compute, comm = streams.new_stream("compute"), streams.new_stream("comm")
    streams.attach_capture(compute, session)
    comm.wait_stream(compute)
    streams.detach_capture(compute)
    assert session.log == [("waited", "compute", "comm")]


def test_a_stream_of_another_runtime_is_refused():
    mine, theirs = CpuStreams(), CpuStreams()
    foreign = theirs.new_stream("foreign")
    with pytest.raises(StreamError, match="does not belong"):
        mine.set_current_stream(foreign)
    with pytest.raises(StreamError, match="does not belong"):
        mine.new_event().record(foreign)


def test_make_streams_gives_logical_streams_on_cpu_and_refuses_unknown_devices():
    assert isinstance(make_streams("cpu"), CpuStreams)
    with pytest.raises(StreamError, match="meta"):
        make_streams("meta")


def test_switching_onto_a_capturing_stream_starts_recording_and_switching_away_stops_it():
    streams = CpuStreams()
    session = FakeSession()
    cap, other = streams.new_stream("cap"), streams.new_stream("other")
    streams.attach_capture(cap, session)

    def body(_: int) -> None:
        streams.set_current_stream(cap)
        streams.set_current_stream(other)

    run_in_threads(1, body, deadline_s=5)
    streams.detach_capture(cap)
    assert session.log == [("start", "rank-0", "cap"), ("stop", "rank-0", "cap")]


def test_a_thread_already_on_the_stream_records_from_attach_and_stops_at_detach():
    streams = CpuStreams()
    session = FakeSession()
    cap = streams.new_stream("cap")
    with streams.use(cap):
        streams.attach_capture(cap, session)
        assert [entry[0] for entry in session.log] == ["start"]
        streams.detach_capture(cap)
        assert [entry[0] for entry in session.log] == ["start", "stop"]


def test_other_threads_on_a_stream_are_named_and_dead_threads_are_forgotten():
    streams = CpuStreams()
    cap = streams.new_stream("cap")
    on_it, release = threading.Event(), threading.Event()

    def sit(_: int) -> None:
        streams.set_current_stream(cap)
        on_it.set()
        release.wait(5)

    sitter = threading.Thread(target=sit, args=(0,), name="sitter", daemon=True)
    sitter.start()
    try:
        assert on_it.wait(5)
        assert streams.other_threads_on(cap) == ["sitter"]
    finally:
        release.set()
        sitter.join(5)
    assert not sitter.is_alive()
    assert streams.other_threads_on(cap) == []


@needs_cuda
def test_cuda_streams_wrap_torch_streams_with_the_same_interface():
    streams = make_streams("cuda")
    assert isinstance(streams, CudaStreams)
    side = streams.new_stream("side")
    with streams.use(side):
        assert streams.current_stream() == side
        assert streams.current_stream().name == "side"
        assert torch.cuda.current_stream() == side.raw
    assert streams.current_stream() == streams.default_stream
    event = side.record_event()
    streams.default_stream.wait_event(event)
    event.synchronize()
    assert (event.num_records, event.num_waits, event.query()) == (1, 1, True)


@needs_cuda
def test_a_new_thread_starts_on_the_cuda_default_stream():
    streams = make_streams("cuda")
    side = streams.new_stream("side")
    with streams.use(side):
        [seen] = run_in_threads(1, lambda _: streams.current_stream(), deadline_s=30)
    assert seen == streams.default_stream
