"""The compiled replay program of an emulated graph: which recorded ops it keeps and how a
fresh result gets back to where it went at capture."""

from __future__ import annotations

import torch

from harness.runtime.emulated_graph import EmulatedGraphs
from harness.runtime.replay_program import compile_op, compile_trace, is_pure_view, out_variant
from harness.runtime.streams import CpuStreams


def _capture(step):
    streams = CpuStreams()
    graphs = EmulatedGraphs(streams, collective_timeout_s=5)
    graph = graphs.new_graph()
    with graphs.capture(graph, streams.new_stream("cap")):
        step()
    return graph


def test_ops_that_only_view_are_left_out_and_writes_through_views_still_replay():
    x, out = torch.arange(6.0), torch.zeros(2, 3)

    def step() -> None:
        grid = x.view(2, 3)  # a pure view: dropped from the program
        doubled = grid * 2
        doubled[:, 1:].add_(grid[:, :2])  # in place through a slice of a fresh result
        x.view(3, 2)[0].mul_(-1)  # in place through a view of an input
        out.copy_(doubled)

    graph = _capture(step)
    program = compile_trace(graph.ops, None)
    views = [op.name for op in graph.ops if is_pure_view(op)]
    assert "aten.view.default" in views and "aten.slice.Tensor" in views
    assert len(program) == graph.num_ops - len(views)
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    graph.replay()
    grid = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    expected = grid * 2
    expected[:, 1:] += grid[:, :2]
    assert torch.equal(out, expected)
    assert x.tolist() == [-1.0, -2.0, 3.0, 4.0, 5.0, 6.0]  # the write reached the input


def test_a_fresh_result_is_computed_where_it_went_at_capture_and_read_from_there():
    x, w, out = torch.ones(2, 3), torch.ones(3, 2), torch.zeros(2, 2)

    def step() -> None:
        hidden = x @ w  # mm: replayed through mm.out into hidden's captured storage
        out.copy_(torch.tanh(hidden) + hidden)

    graph = _capture(step)
    x.copy_(torch.full((2, 3), -0.5))
    graph.replay()
    hidden = torch.full((2, 2), -1.5)
    assert torch.equal(out, torch.tanh(hidden) + hidden)
    graph.replay()  # replay is repeatable on the same storage
    assert torch.equal(out, torch.tanh(hidden) + hidden)


def test_an_out_overload_is_used_only_where_its_arguments_are_the_ops_own():
    aten = torch.ops.aten
    assert out_variant(aten.add.Tensor) == (aten.add.out, "out")
    assert out_variant(aten.index.Tensor) == (aten.index.Tensor_out, "out")
    # _to_copy.out drops the dtype argument (the out tensor carries it): not the same call.
    assert out_variant(aten._to_copy.default) is None
    assert out_variant(aten.topk.default) is None  # two results


def test_a_conversion_replays_as_one_copy_into_its_captured_result_with_the_same_values():
    counts, out = torch.tensor([3, -2, 7]), torch.zeros(3, dtype=torch.float64)

    def step() -> None:
        out.copy_(counts.to(torch.float64) * 0.5)

    graph = _capture(step)
    conversion = [compile_op(op, None) for op in graph.ops if op.name == "aten._to_copy.default"]
    assert len(conversion) == 1 and conversion[0][3] is None  # nothing copied after it
    counts.copy_(torch.tensor([2**53 + 1, -5, 1]))  # past float64's integers: rounds alike
    graph.replay()
    assert torch.equal(out, counts.to(torch.float64) * 0.5)
