"""The rank code on CUDA: real CUDA graphs and NCCL, on the single-rank GPU world.

The GPU machine has one GPU, so these tests run DP rank 0 of a world of one: a process group
whose CPU backend (gloo) carries the DP sync and whose CUDA backend is a real NCCL group of
size one (`harness.world.gpu`). Graphs are captured and replayed with torch.cuda.graph, the
microbatch threads launch onto the capture stream, and the all-to-alls are NCCL collectives
inside the graph. Every result is compared with the CPU reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness.check.judge import judge
from harness.check.registry import check_startup
from harness.runtime.comm import EagerAllToAll
from harness.runtime.cublas import drain_cublas_handles_at_capture
from harness.runtime.graph_lifecycle import GraphState
from harness.runtime.graphs import make_graph_backend
from harness.runtime.streams import make_streams
from harness.sut.rank_runtime import RankRuntime
from harness.world.gpu.steps import decode, eager_rerun, one_rank_scenario, run_checked
from harness.world.gpu.world import open_single_rank_gpu_world, single_rank_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (the single-rank GPU world runs NCCL)"),
]

BASE = {"capture_sizes": (4, 8, 16), "max_num_reqs": 16, "max_num_batched_tokens": 16,
        "decode_threshold": 4, "prefill_threshold": 16}
COLLECTIVE_S, HANG_S, STARTUP_DEADLINE_S = 10.0, 15.0, 120.0


def make_runtime(world, warm_cublas: bool = True, **fields) -> RankRuntime:
    config = single_rank_config(**{**BASE, **fields})
    return RankRuntime(config, world.rank, world.group, device=str(world.device),
                       collective_timeout_s=COLLECTIVE_S, hang_timeout_s=HANG_S,
                       warm_cublas=warm_cublas)


def failed_checkers(startup, config) -> list[str]:
    return [v.checker for v in check_startup([startup], STARTUP_DEADLINE_S, config)
            if not v.ok]


def describe(checked) -> str:
    return "\n".join(c.describe() for c in checked)


@pytest.fixture(scope="module")
def world():
    with open_single_rank_gpu_world(timeout_s=30.0) as w:
        yield w


@pytest.fixture(scope="module")
def captured(world):
    runtime = make_runtime(world)
    return runtime, runtime.startup()


def test_the_single_rank_gpu_world_runs_a_real_nccl_all_to_all_of_size_one(world):
    assert isinstance(world.group._get_backend(torch.device("cuda")), dist.ProcessGroupNCCL)
    inp = torch.arange(6, dtype=torch.float64, device=world.device)
    out = torch.zeros_like(inp)
    EagerAllToAll(world.group, COLLECTIVE_S)(out, inp)()
    assert out.tolist() == inp.tolist()


def test_a_scenario_run_on_the_gpu_world_is_a_history_every_checker_holds_on(world):
    scenario = one_rank_scenario(single_rank_config(**BASE), decode(16), decode(3), (2, 3, 4))
    result = judge(world.run(scenario))
    assert world.graphs == "cuda" and result.ok, result.failed_verdicts()
    assert [s.records[0].executed for s in result.steps] == ["replay"] * 3


def test_an_nccl_all_to_all_inside_a_capture_waits_on_the_stream_and_replays(world):
    streams = make_streams(world.device)
    graphs = make_graph_backend(streams)
    cap = streams.new_stream("cap")
    a2a = EagerAllToAll(world.group, COLLECTIVE_S)
    inp = torch.ones(8, dtype=torch.float64, device=world.device)
    out = torch.zeros_like(inp)
    with streams.use(cap):
        a2a(out, inp)()  # the communicator and the stream are warm before the capture
    streams.synchronize()
    graph = graphs.new_graph()
    with graphs.capture(graph, cap, pool=graphs.new_pool()):
        a2a(out, inp)()  # a timed (host-polling) wait here would fail the capture
        out.mul_(2.0)
    inp.fill_(3.0)
    out.zero_()
    graph.replay()
    streams.synchronize()
    assert graph.state is GraphState.CAPTURED and graph.is_empty is False
    assert out.tolist() == [6.0] * 8


def test_every_full_graph_is_captured_with_work_and_leaves_no_thread_behind(captured):
    runtime, startup = captured
    assert startup.error is None, startup.error.describe()
    assert failed_checkers(startup, runtime.config) == []
    labels = [g.label for g in startup.graphs]
    assert any("ub2" in label for label in labels) and any("ub2" not in label for label in labels)
    assert all(g.empty is False for g in startup.graphs), labels
    assert startup.threads_alive == () and not startup.pending_run
    assert {t.device.type for t in rank_tensors(runtime)} == {"cuda"}


def rank_tensors(runtime: RankRuntime) -> list[torch.Tensor]:
    """Every tensor the rank allocated: weights, state, comm, step and metadata buffers."""
    tensors = [*runtime.model.weights.tensors().values(), runtime.cache.state]
    for bufs in runtime.model.reserved_buffers().values():
        tensors += [bufs.dispatch_send, bufs.dispatch_recv, bufs.combine_send, bufs.combine_recv]
    for graph in runtime.manager.captured.values():
        tensors += [t for t in vars(graph.buffers).values() if isinstance(t, torch.Tensor)]
    for meta in [*runtime.runner.metas, runtime.manager.whole_step_meta]:
        tensors += [meta.query_start_loc, meta.seq_lens]
    return tensors


def test_microbatched_full_replays_on_cuda_match_the_cpu_reference(captured):
    runtime, _ = captured
    checked = run_checked(runtime, one_rank_scenario(runtime.config, decode(16), decode(8),
                                                     decode(6), decode(12)))
    assert [c.record.executed for c in checked] == ["replay"] * 4, describe(checked)
    assert all(c.record.plan.desc.microbatched for c in checked), describe(checked)
    assert all(not c.problems for c in checked), describe(checked)


def test_a_whole_step_full_replay_on_cuda_matches_the_cpu_reference(captured):
    runtime, _ = captured
    checked = run_checked(runtime, one_rank_scenario(runtime.config, (2, 3, 4), decode(3)))
    assert [c.record.executed for c in checked] == ["replay"] * 2, describe(checked)
    assert not any(c.record.plan.desc.microbatched for c in checked), describe(checked)
    assert all(not c.problems for c in checked), describe(checked)


def test_a_microbatched_replay_equals_the_same_step_run_eagerly_on_the_threads(captured):
    runtime, _ = captured
    scenario = one_rank_scenario(runtime.config, decode(14))
    [replayed] = run_checked(runtime, scenario)
    desc = replayed.record.plan.desc
    assert replayed.record.executed == "replay" and desc.microbatched, replayed.describe()
    requests = scenario.requests()[0][0]
    eager_out, eager_state = eager_rerun(runtime, desc, requests, scenario.steps[0][0].query_lens)
    assert torch.allclose(replayed.output, eager_out, atol=1e-12, rtol=0)
    assert torch.allclose(replayed.state, eager_state, atol=1e-12, rtol=0)


def test_a_replay_after_inputs_are_refreshed_in_place_reads_the_new_inputs(captured):
    runtime, _ = captured
    # The same graph three times: new positions and token ids, then fewer real tokens.
    checked = run_checked(runtime, one_rank_scenario(runtime.config, decode(16), decode(16),
                                                     decode(11)))
    graphs = {c.record.plan.desc for c in checked}
    assert len(graphs) == 1 and [c.record.executed for c in checked] == ["replay"] * 3
    assert all(not c.problems for c in checked), describe(checked)
    first, second, third = (c.output for c in checked)
    assert not torch.allclose(first, second)
    assert not torch.allclose(second[:11], third)


def test_an_eager_microbatched_step_on_cuda_matches_the_cpu_reference(world):
    runtime = make_runtime(world, cudagraph_mode="NONE")
    checked = run_checked(runtime, one_rank_scenario(runtime.config, decode(16), decode(9)))
    assert [c.record.executed for c in checked] == ["eager-microbatched"] * 2, describe(checked)
    assert all(not c.problems for c in checked), describe(checked)
    assert runtime.runner.alive_threads() == []


def test_capturing_on_the_side_stream_fails_the_capture_and_releases_the_threads(world):
    # The threads run their step eagerly beside the capture, on the runner's stream. On CUDA
    # that is not a silent empty graph: under torch's default ("global") capture mode their
    # eager allocations are illegal while another thread captures, so the capture fails.
    runtime = make_runtime(world, capture_on="side")
    startup = runtime.startup()
    assert startup.error is not None, [g.label for g in startup.graphs]
    assert "captur" in startup.error.describe().lower(), startup.error.describe()
    assert "startup" in failed_checkers(startup, runtime.config)
    assert startup.threads_alive == () and not startup.pending_run
    assert runtime.runner.alive_threads() == []
    # Only the whole-step graph captured before the first twin exists, and it holds work.
    assert [(g.num_ubatches, g.empty) for g in startup.graphs] == [(1, False)]


def test_a_microbatch_thread_without_cublas_warm_up_fails_the_capture_and_is_released():
    # Its own world: the failed capture must not touch the module's communicator.
    with open_single_rank_gpu_world(timeout_s=30.0) as world:
        runtime = make_runtime(world, warm_cublas=False)
        drain_cublas_handles_at_capture(runtime)  # no free handle: each thread creates one
        startup = runtime.startup()
        assert startup.error is not None, [g.label for g in startup.graphs]
        assert "CUBLAS" in startup.error.describe(), startup.error.describe()
        assert "startup" in failed_checkers(startup, runtime.config)
        assert startup.threads_alive == () and not startup.pending_run
        assert not runtime.runner.has_pending_run and runtime.runner.alive_threads() == []
        assert all(g.num_ubatches == 1 for g in startup.graphs)


def test_the_cublas_warm_up_lets_threads_without_a_free_handle_capture(world):
    runtime = make_runtime(world)
    drain_cublas_handles_at_capture(runtime)
    startup = runtime.startup()
    assert startup.error is None, startup.error.describe()
    assert failed_checkers(startup, runtime.config) == []
    checked = run_checked(runtime, one_rank_scenario(runtime.config, decode(16)))
    assert checked[0].record.executed == "replay" and not checked[0].problems, describe(checked)


def test_a_free_cublas_handle_left_by_the_warmup_threads_masks_a_missing_warm_up(world):
    # torch 2.11 behaviour, pinned: the eager warmup's threads give their cuBLAS handles back
    # when they exit, so capture threads without a warm-up find one and nothing fails. This
    # is why the hazard needs `drain_cublas_handles_at_capture` to show.
    runtime = make_runtime(world, warm_cublas=False)
    startup = runtime.startup()
    assert startup.error is None, startup.error.describe()
    assert any(g.num_ubatches > 1 for g in startup.graphs)
