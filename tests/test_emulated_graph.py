"""The emulated CUDA graph: what it captures, what replay does, and how capture fails."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from harness.runtime.emulated_graph import EMPTY_GRAPH_WARNING, EmulatedGraphs
from harness.runtime.graph_lifecycle import CaptureError, GraphState, ReplayError
from harness.runtime.graphs import CudaGraphs, make_graph_backend
from harness.runtime.op_record import CollectiveCall
from harness.runtime.process_group import as_process_group
from harness.runtime.streams import CpuStreams, make_streams
from harness.world.sim.threads import RankFailure, ThreadWorld, run_in_threads


def needs_cuda(test):
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(skip(test))


@pytest.fixture
def rig():
    """One rank's CPU streams, the emulated backend over them and a capture stream."""
    streams = CpuStreams()
    return streams, EmulatedGraphs(streams, collective_timeout_s=5), streams.new_stream("cap")


def test_replay_reads_inputs_refreshed_in_place_and_writes_the_persistent_output(rig):
    streams, graphs, cap = rig
    x, w, out = torch.ones(2, 3), torch.arange(6.0).reshape(3, 2), torch.zeros(2, 2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        out.copy_(torch.relu(x @ w - 4))
    x.copy_(torch.full((2, 3), 2.0))
    graph.replay()
    assert torch.equal(out, torch.relu(x @ w - 4))
    assert not torch.equal(out, torch.relu(torch.ones(2, 3) @ w - 4))


def test_control_flow_and_shapes_are_frozen_at_capture(rig):
    streams, graphs, cap = rig
    x, out = torch.arange(4.0), torch.zeros(4)
    plan = {"double": True, "rows": 2}
    graph = graphs.new_graph()

    def step() -> None:
        n = plan["rows"]
        out[:n].copy_(x[:n] * 2 if plan["double"] else x[:n] + 100)

    with graphs.capture(graph, cap):
        step()
    plan.update(double=False, rows=4)  # an eager step would now add 100 to all four rows
    x.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
    graph.replay()
    assert out.tolist() == [20.0, 40.0, 0.0, 0.0]


def test_a_tensor_produced_inside_capture_shows_new_values_after_replay(rig):
    streams, graphs, cap = rig
    x, w = torch.ones(3), torch.ones(3, 2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        hidden = x @ w
        activated = torch.sigmoid(hidden)
    x.fill_(-1.0)
    graph.replay()
    assert hidden.tolist() == [-3.0, -3.0]
    assert torch.equal(activated, torch.sigmoid(torch.full((2,), -3.0)))


def test_in_place_size_changes_replay_on_the_shape_each_op_saw(rig):
    # A 1-D `x @ w` records unsqueeze, mm, squeeze_: squeeze_ changes the result's size
    # after mm recorded it, so replay must rebuild each tensor as it was, not reuse it.
    streams, graphs, cap = rig
    x, w = torch.ones(3), torch.arange(6.0).reshape(3, 2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        y = x @ w
    assert "aten.squeeze_.dim" in graph.op_names()
    x.copy_(torch.tensor([1.0, 0.0, 2.0]))
    graph.replay()
    assert y.shape == (2,)
    assert y.tolist() == [8.0, 11.0]


def test_memory_that_capture_only_allocated_is_left_alone_at_replay(rig):
    streams, graphs, cap = rig
    x = torch.ones(2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        buffer = torch.empty(4)
        buffer[:2].copy_(x * 3)
    buffer[2:].fill_(7.0)  # a real replay never writes memory that was only allocated
    x.fill_(2.0)
    graph.replay()
    assert buffer.tolist() == [6.0, 6.0, 7.0, 7.0]


def test_recorded_ops_name_the_op_and_the_thread_and_stream_that_issued_it(rig):
    streams, graphs, cap = rig
    x = torch.ones(2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        x.mul_(2)
    [op] = graph.ops
    assert (op.name, op.stream, op.thread) == ("aten.mul_.Tensor", "cap",
                                               threading.current_thread().name)
    assert graph.num_ops == 1 and graph.collectives() == ()


def test_a_thread_on_another_stream_is_not_captured_and_its_output_goes_stale(rig):
    streams, graphs, cap = rig
    side = streams.new_stream("side")
    x, captured, stale = torch.ones(2), torch.zeros(2), torch.zeros(2)

    def on_own_stream(_: int) -> None:
        with streams.use(side):
            stale.copy_(x + 1)

    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        captured.copy_(x + 1)
        run_in_threads(1, on_own_stream, deadline_s=5)
    x.fill_(10.0)
    graph.replay()
    assert captured.tolist() == [11.0, 11.0]
    assert stale.tolist() == [2.0, 2.0]
    assert {op.thread for op in graph.ops} == {threading.current_thread().name}


def test_work_the_capturing_thread_issues_after_switching_streams_is_not_captured(rig):
    streams, graphs, cap = rig
    side = streams.new_stream("side")
    x, captured, stale = torch.ones(2), torch.zeros(2), torch.zeros(2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        with streams.use(side):
            stale.copy_(x * 5)
        captured.copy_(x * 5)  # back on the capture stream: recorded again
    x.fill_(2.0)
    graph.replay()
    assert (captured.tolist(), stale.tolist()) == ([10.0, 10.0], [5.0, 5.0])


def test_worker_threads_switching_onto_the_capture_stream_are_captured_but_not_one_on_its_own():
    streams = CpuStreams()
    graphs = EmulatedGraphs(streams)
    cap, own = streams.new_stream("cap"), streams.new_stream("own")
    x = torch.ones(3)
    outputs = torch.zeros(3, 3)

    def worker(row: int, stream) -> None:
        streams.set_current_stream(stream)
        outputs[row].copy_(x * (row + 1))

    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        # One at a time, like microbatch threads handing off: the op order is deterministic.
        run_in_threads(1, lambda _: worker(0, cap), deadline_s=5, name="ubatch0")
        run_in_threads(1, lambda _: worker(1, cap), deadline_s=5, name="ubatch1")
        run_in_threads(1, lambda _: worker(2, own), deadline_s=5, name="stray")
    x.fill_(10.0)
    graph.replay()
    assert outputs.tolist() == [[10.0] * 3, [20.0] * 3, [3.0] * 3]
    assert {op.thread for op in graph.ops} == {"ubatch0-0", "ubatch1-0"}


@pytest.mark.parametrize("sync", [
    pytest.param(lambda t: t.sum().item(), id="item"),
    pytest.param(lambda t: t.tolist(), id="tolist"),
    pytest.param(lambda t: t.cpu(), id="cpu"),
    pytest.param(lambda t: bool(t[0] > 0), id="bool"),
    pytest.param(lambda t: torch.nonzero(t), id="nonzero"),
    pytest.param(lambda t: t[t > 1], id="boolean-mask-read"),
])
def test_a_host_sync_during_capture_raises_and_fails_the_graph(rig, sync):
    streams, graphs, cap = rig
    x = torch.ones(3)
    graph = graphs.new_graph()
    with pytest.raises(CaptureError, match="host sync"):
        with graphs.capture(graph, cap):
            sync(x + 1)
    assert graph.state is GraphState.FAILED
    with pytest.raises(ReplayError, match="capture failed: host sync"):
        graph.replay()


def test_indexing_with_integer_indices_and_assigning_through_a_mask_are_captured(rig):
    streams, graphs, cap = rig
    x, out = torch.arange(4.0), torch.zeros(2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        out.copy_(x[torch.tensor([3, 0])])
        x[x > 1] = 0.0
    x.copy_(torch.tensor([5.0, 1.0, 2.0, 7.0]))
    graph.replay()
    assert (out.tolist(), x.tolist()) == ([7.0, 5.0], [0.0, 1.0, 0.0, 0.0])


def test_a_host_sync_in_a_worker_thread_invalidates_the_capture_even_if_caught(rig):
    streams, graphs, cap = rig
    x = torch.ones(2)

    def worker(_: int) -> None:
        streams.set_current_stream(cap)
        x.sum().item()

    graph = graphs.new_graph()
    with pytest.raises(CaptureError, match="capture invalidated: host sync"):
        with graphs.capture(graph, cap):
            with pytest.raises(RankFailure):
                run_in_threads(1, worker, deadline_s=5)
    assert graph.state is GraphState.FAILED


def test_a_host_sync_outside_capture_is_fine_after_the_capture_ended(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        y = torch.ones(2) * 2
    with streams.use(cap):
        assert y.sum().item() == 4.0
    assert graph.state is GraphState.CAPTURED


def test_an_empty_capture_is_reported_with_a_warning_and_no_ops(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with pytest.warns(UserWarning, match=EMPTY_GRAPH_WARNING):
        with graphs.capture(graph, cap):
            pass
    assert (graph.num_ops, graph.is_empty, graph.state) == (0, True, GraphState.CAPTURED)
    graph.replay()  # legal, and does nothing


def test_a_capture_with_ops_is_not_empty(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        torch.ones(1).add_(1)
    assert graph.num_ops == 2 and not graph.is_empty


def test_replay_before_the_capture_ended_raises(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with pytest.raises(ReplayError, match="is new"):
        graph.replay()
    with graphs.capture(graph, cap):
        torch.ones(1)
        with pytest.raises(ReplayError, match="is capturing"):
            graph.replay()
    graph.replay()


def test_a_capture_that_raised_leaves_a_graph_that_refuses_to_replay(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with pytest.raises(ValueError, match="boom"):
        with graphs.capture(graph, cap):
            torch.ones(1)
            raise ValueError("boom")
    assert graph.state is GraphState.FAILED
    assert streams.current_stream() is streams.default_stream
    with pytest.raises(ReplayError, match="capture failed"):
        graph.replay()


def test_a_graph_is_captured_once_and_never_on_the_default_stream(rig):
    streams, graphs, cap = rig
    graph = graphs.new_graph()
    with pytest.raises(CaptureError, match="non-default stream"):
        with graphs.capture(graph, streams.default_stream):
            pass
    with graphs.capture(graph, cap):
        torch.ones(1)
    with pytest.raises(CaptureError, match="captured once"):
        with graphs.capture(graph, cap):
            pass


def test_a_thread_already_sitting_on_the_capture_stream_is_refused_not_silently_missed(rig):
    streams, graphs, cap = rig
    on_it, release = threading.Event(), threading.Event()

    def sit() -> None:
        streams.set_current_stream(cap)
        on_it.set()
        release.wait(5)

    sitter = threading.Thread(target=sit, name="sitter", daemon=True)
    sitter.start()
    try:
        assert on_it.wait(5)
        with pytest.raises(CaptureError, match="sitter"):
            with graphs.capture(graphs.new_graph(), cap):
                pass
    finally:
        release.set()
        sitter.join(5)
    assert not sitter.is_alive()


def test_a_stream_that_waits_on_a_captured_event_joins_the_capture_until_joined_back(rig):
    # The microbatch pattern: compute records, comm waits (fork), comm records, compute waits.
    streams, graphs, cap = rig
    comm = streams.new_stream("comm")
    x, out = torch.ones(2), torch.zeros(2)
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        h = x * 2
        forked = cap.record_event()
        with streams.use(comm):
            comm.wait_event(forked)
            sent = h + 1
            joined = comm.record_event()
        cap.wait_event(joined)
        out.copy_(sent * 10)
    assert [op.stream for op in graph.ops] == ["cap", "comm", "cap", "cap"]
    x.fill_(3.0)
    graph.replay()
    assert out.tolist() == [70.0, 70.0]
    with streams.use(comm):
        torch.ones(1)  # after the capture ended the fork is over: not recorded
    assert graph.num_ops == 4


def test_a_forked_stream_that_is_not_joined_back_invalidates_the_capture(rig):
    streams, graphs, cap = rig
    comm = streams.new_stream("comm")
    graph = graphs.new_graph()
    with pytest.raises(CaptureError, match=r"\['comm'\].*not joined back"):
        with graphs.capture(graph, cap):
            comm.wait_event(cap.record_event())
            with streams.use(comm):
                early = comm.record_event()
                torch.ones(1)  # after the event the origin waits on: still unjoined
            cap.wait_event(early)
    assert graph.state is GraphState.FAILED


def test_a_two_rank_all_to_all_between_matmul_and_relu_replays_like_eager_on_both_ranks():
    # Uneven splits: rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 and 2.
    send = {0: [1, 3], 1: [2, 2]}
    recv = {r: [send[peer][r] for peer in range(2)] for r in range(2)}
    w = torch.arange(-6.0, 6.0).reshape(3, 4) / 4

    def rank_body(rank: int, backend) -> tuple:
        group = as_process_group(backend)
        streams = CpuStreams()
        graphs = EmulatedGraphs(streams, collective_timeout_s=5)
        cap = streams.new_stream("cap")
        x = torch.arange(12.0).reshape(4, 3) + 100 * rank  # provenance: rank in the hundreds
        out = torch.zeros(sum(recv[rank]), 4)

        def step(dest: torch.Tensor) -> None:
            arrived = torch.empty(sum(recv[rank]), 4)
            dist.all_to_all_single(arrived, x @ w, recv[rank], send[rank], group=group)
            dest.copy_(torch.relu(arrived))

        graph = graphs.new_graph()
        with graphs.capture(graph, cap):
            step(out)
        captured = out.clone()
        x.copy_(-x.flip(0))
        graph.replay()
        eager = torch.zeros_like(out)
        step(eager)
        return captured, out.clone(), eager, graph.collectives()

    with ThreadWorld(2, timeout_s=5) as world:
        results = world.run(rank_body, deadline_s=15)
    for rank, (captured, replayed, eager, collectives) in enumerate(results):
        assert torch.equal(replayed, eager)
        assert not torch.equal(replayed, captured)
        assert collectives == (CollectiveCall(
            op="c10d.alltoall_base_.default",
            shapes=((sum(recv[rank]), 4), (4, 4)), dtypes=("float32", "float32"),
            output_split_sizes=tuple(recv[rank]), input_split_sizes=tuple(send[rank])),)


def test_collective_fingerprints_list_each_collective_in_issue_order_and_replay_sums():
    def rank_body(rank: int, backend) -> tuple:
        group = as_process_group(backend)
        streams = CpuStreams()
        graphs = EmulatedGraphs(streams, collective_timeout_s=5)
        cap = streams.new_stream("cap")
        counts = torch.tensor([rank + 1, 10 * (rank + 1)])
        graph = graphs.new_graph()
        with graphs.capture(graph, cap):
            total = counts.clone()
            dist.all_reduce(total, group=group)
            swapped = torch.empty(2, dtype=torch.int64)
            dist.all_to_all_single(swapped, total, group=group)
        counts.mul_(100)
        graph.replay()
        return total.tolist(), swapped.tolist(), graph.collectives()

    with ThreadWorld(2, timeout_s=5) as world:
        results = world.run(rank_body, deadline_s=15)
    for total, _, collectives in results:
        assert total == [300, 3000]
        assert [c.op for c in collectives] == ["c10d.allreduce_.default",
                                              "c10d.alltoall_base_.default"]
        assert collectives[0].shapes == ((2,),) and collectives[0].dtypes == ("int64",)
        assert collectives[1].output_split_sizes == ()  # even split: no sizes given
    assert [swapped for _, swapped, _ in results] == [[300, 300], [3000, 3000]]


def test_a_bare_gloo_backend_bypasses_the_dispatcher_so_its_collective_is_not_captured():
    # Why `as_process_group` exists: a gloo backend on its own is invisible to capture.
    def rank_body(rank: int, group) -> tuple:
        backend = group._get_backend(torch.device("cpu"))
        streams = CpuStreams()
        graphs = EmulatedGraphs(streams, collective_timeout_s=5)
        cap = streams.new_stream("cap")
        x, out = torch.full((2,), float(rank)), torch.zeros(2)
        graph = graphs.new_graph()
        with graphs.capture(graph, cap):
            backend.alltoall_base(out, x + 1, [], []).wait()
        x.fill_(50.0)
        graph.replay()
        return out.tolist(), graph.op_names()

    with ThreadWorld(2, timeout_s=5) as world:
        results = world.run(rank_body, deadline_s=15)
    assert [out for out, _ in results] == [[1.0, 2.0], [1.0, 2.0]]  # stale: from capture
    assert all(not any(n.startswith("c10d.") for n in names) for _, names in results)


def test_make_graph_backend_emulates_over_cpu_streams():
    assert isinstance(make_graph_backend(make_streams("cpu")), EmulatedGraphs)


@needs_cuda
def test_a_real_cuda_graph_replays_inputs_refreshed_in_place():
    streams = make_streams("cuda")
    graphs = make_graph_backend(streams)
    assert isinstance(graphs, CudaGraphs)
    cap = streams.new_stream("cap")
    x, w = torch.ones(4, 4, device="cuda"), torch.eye(4, device="cuda")
    out = torch.zeros(4, 4, device="cuda")
    streams.synchronize()  # the tensors are made on the default stream (CUDA sanitizer: a race)
    with streams.use(cap):  # warm cuBLAS up on the capture stream first
        out.copy_(torch.relu(x @ w))
    streams.synchronize()
    graph = graphs.new_graph()
    with pytest.raises(ReplayError, match="is new"):
        graph.replay()
    with graphs.capture(graph, cap, pool=graphs.new_pool()):
        out.copy_(torch.relu(x @ w))
    x.fill_(3.0)
    graph.replay()
    streams.synchronize()
    assert graph.state is GraphState.CAPTURED and graph.is_empty is False
    assert torch.equal(out, torch.full((4, 4), 3.0, device="cuda"))


@needs_cuda
def test_a_real_cuda_graph_is_empty_when_the_work_ran_on_another_stream():
    streams = make_streams("cuda")
    graphs = make_graph_backend(streams)
    cap = streams.new_stream("cap")
    x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        run_in_threads(1, lambda _: out.copy_(x * 2), deadline_s=30)  # thread: own stream
    streams.synchronize()
    assert graph.is_empty is True


@needs_cuda
def test_a_host_sync_during_a_real_capture_fails_the_graph_as_in_the_emulation():
    streams = make_streams("cuda")
    graphs = make_graph_backend(streams)
    cap = streams.new_stream("cap")
    x = torch.ones(4, device="cuda")
    graph = graphs.new_graph()
    with pytest.raises(RuntimeError):
        with graphs.capture(graph, cap):
            (x + 1).sum().item()
    assert graph.state is GraphState.FAILED
    with pytest.raises(ReplayError, match="capture failed"):
        graph.replay()


@needs_cuda
def test_a_real_cuda_graph_captures_a_stream_forked_and_joined_through_events():
    streams = make_streams("cuda")
    graphs = make_graph_backend(streams)
    cap, comm = streams.new_stream("cap"), streams.new_stream("comm")
    x, out = torch.ones(2, device="cuda"), torch.zeros(2, device="cuda")
    graph = graphs.new_graph()
    with graphs.capture(graph, cap):
        h = x * 2
        forked = cap.record_event()
        with streams.use(comm):
            comm.wait_event(forked)
            sent = h + 1
            joined = comm.record_event()
        cap.wait_event(joined)
        out.copy_(sent * 10)
    x.fill_(3.0)
    graph.replay()
    streams.synchronize()
    assert out.tolist() == [70.0, 70.0]


@needs_cuda
def test_a_real_cuda_forked_stream_not_joined_back_fails_the_capture():
    streams = make_streams("cuda")
    graphs = make_graph_backend(streams)
    cap, comm = streams.new_stream("cap"), streams.new_stream("comm")
    graph = graphs.new_graph()
    with pytest.raises(RuntimeError):
        with graphs.capture(graph, cap):
            comm.wait_event(cap.record_event())
            with streams.use(comm):
                early = comm.record_event()
                torch.ones(1, device="cuda").add_(1)
            cap.wait_event(early)
    assert graph.state is GraphState.FAILED


def test_a_capture_leaves_no_torch_mode_behind_in_the_capturing_thread_however_it_ends(rig):
    streams, graphs, cap = rig
    with graphs.capture(graphs.new_graph(), cap):
        torch.ones(1)
    with pytest.raises(CaptureError):
        with graphs.capture(graphs.new_graph(), cap):
            torch.ones(1).item()
    assert _get_current_dispatch_mode_stack() == []
    assert _get_current_function_mode_stack() == []


def test_switching_streams_under_a_mode_entered_on_the_capture_stream_is_refused(rig):
    streams, graphs, cap = rig
    with pytest.raises(CaptureError, match="mode entered after the switch"):
        with graphs.capture(graphs.new_graph(), cap):
            with TorchDispatchMode():
                streams.set_current_stream(streams.default_stream)
    assert _get_current_dispatch_mode_stack() == []
    assert _get_current_function_mode_stack() == []
