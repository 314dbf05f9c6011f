"""A replayed emulated graph on a CPU rank's stand-ins logs again the stream order its capture
logged, on the streams the capture took in, so stream_order judges replay steps: a replay
whose capture read a side stream's write with no wait is caught, a joined one holds (no vLLM
needed)."""

from __future__ import annotations

import torch

from harness.check.stream_order import first_race
from harness.vllm_exec.stand_ins import CpuStandIns


def captured(*, wait_before_read: bool):
    """A graph captured on one stream that forks a side stream which writes `x`; the origin
    reads `x` before or after waiting for the side stream's event. Also logs an access on a
    stream the capture never took in."""
    s = CpuStandIns(collective_timeout_s=1.0)
    cuda, log = s.proxy.cuda, s.stream_log
    origin, side, outside = cuda.Stream(), cuda.Stream(), cuda.Stream()
    x = torch.zeros(4)
    graph = cuda.CUDAGraph()
    with cuda.graph(graph, stream=origin):
        fork, join = cuda.Event(), cuda.Event()
        fork.record(origin)
        cuda.set_stream(side)
        fork.wait(side)  # the side stream joins the capture
        x.add_(1.0)
        log.access("write", "x", "gather")
        join.record(side)
        cuda.set_stream(origin)
        if wait_before_read:
            join.wait(origin)
        log.access("read", "x", "dispatch")
        join.wait(origin)  # joined back either way: the capture is valid
        with cuda.stream(outside):
            log.access("write", "y", "elsewhere")  # ran at capture, not in the graph
    return s, graph, x, (origin.name, side.name, outside.name)


def replayed(stand_ins, graph):
    mark = stand_ins.stream_log.mark()
    graph.replay()
    return stand_ins.stream_log.since(mark)


def test_a_replay_whose_capture_read_before_waiting_is_caught_by_stream_order():
    stand_ins, graph, x, (origin, side, _) = captured(wait_before_read=False)
    ops = replayed(stand_ins, graph)
    assert x.tolist() == [2.0] * 4  # the replay ran the captured add once more
    assert first_race(ops) == (f"dispatch on stream {origin} reads x, written by gather on "
                               f"stream {side} with no event wait ordering the write before "
                               "the read")
    assert replayed(stand_ins, graph) == ops  # every replay logs it again


def test_a_replay_of_a_joined_capture_holds_and_logs_only_the_captured_streams():
    stand_ins, graph, _, (origin, side, outside) = captured(wait_before_read=True)
    ops = replayed(stand_ins, graph)
    assert first_race(ops) is None
    assert {op.stream for op in ops} == {origin, side}
    assert [op.kind for op in ops if op.op] == ["write", "read"]
    # The outside stream's access was logged when it ran, at capture, and never again.
    everything = stand_ins.stream_log.since(0)
    assert [op.stream for op in everything].count(outside) == 1
