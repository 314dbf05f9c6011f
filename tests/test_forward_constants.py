"""What a step rebuilds per run, and what it no longer does: the forward's shape-only tensors
are built once and shared, and the step buffers are filled with what the requests say."""

from __future__ import annotations

import torch
from op_log import OpLog

from harness.config import HarnessConfig
from harness.model.constants import ShapeConstants
from harness.model.mini_moe import MiniMoE
from harness.model.state import RequestSpec, StateCache
from harness.model.step_buffers import StepBuffers, UbatchMetadata, prepare_microbatch
from harness.model.weights import DTYPE
from harness.runtime.comm import EagerAllToAll
from harness.runtime.overlap import NoOverlap
from harness.runtime.process_group import as_process_group
from harness.world.sim.threads import ThreadWorld

TIMEOUT_S = 5.0
# Ops that only build a tensor from shapes and constants: none per run once built.
SHAPE_ONLY = ("aten.arange", "aten.full", "aten.scalar_tensor")


def test_shape_constants_are_built_once_per_key_with_the_values_their_ops_give():
    constants = ShapeConstants(torch.device("cpu"))
    assert constants.arange(5) is constants.arange(5)
    assert torch.equal(constants.arange(5), torch.arange(5))
    assert constants.arange(5, DTYPE).dtype is DTYPE and constants.arange(5) is not \
        constants.arange(5, DTYPE)
    assert constants.scalar(-1).dim() == 0 and constants.scalar(-1).item() == -1
    assert constants.scalar(-1, DTYPE).dtype is DTYPE
    assert torch.equal(constants.column(3, 2.0), torch.full((3, 1), 2.0, dtype=DTYPE))
    assert torch.equal(constants.token_index(4, 2, 3),
                       torch.tensor([[4.0], [4.0], [4.0], [5.0], [5.0], [5.0]], dtype=DTYPE))


def test_a_forward_of_shapes_seen_before_issues_no_op_that_only_builds_from_shapes():
    config = HarnessConfig.of(dp_size=2, hidden_size=8, experts_per_rank=2, top_k=2)

    def rank_body(rank: int, group) -> tuple[list[str], list[str]]:
        model = MiniMoE(config, rank, EagerAllToAll(as_process_group(group), TIMEOUT_S))
        cache = StateCache(8, 8)
        step = StepBuffers(6, 3, 8, cache.scratch_slot)
        step.fill([RequestSpec(0, 2, (1, 2)), RequestSpec(1, 0, (3,))])
        mb = prepare_microbatch(step, UbatchMetadata(3), step.whole(), 0)
        logs = []
        for _ in range(2):
            with OpLog() as log:  # thread-local: sees only this rank's ops
                model.forward(mb, cache, NoOverlap(0))
            logs.append(log.ops)
        return logs[0], logs[1]

    with ThreadWorld(2, timeout_s=TIMEOUT_S) as world:
        results = world.run(rank_body, deadline_s=60.0)
    for first, second in results:
        assert any(op.startswith(SHAPE_ONLY) for op in first)  # the first run builds them
        assert not [op for op in second if op.startswith(SHAPE_ONLY)]
        assert len(second) < len(first)


def test_fill_writes_each_buffer_from_the_requests_and_pads_the_rest():
    step = StepBuffers(6, 4, 2, scratch_slot=9)
    assert step.fill([RequestSpec(3, 2, (7, 8)), RequestSpec(5, 0, (4,))],
                     pad_token_id=1, pad_position=2) == 3
    assert step.input_ids.tolist() == [7, 8, 4, 1, 1, 1]
    assert step.positions.tolist() == [2, 3, 0, 2, 2, 2]
    assert step.is_padding.tolist() == [False, False, False, True, True, True]
    assert step.query_start_loc.tolist() == [0, 2, 3, 3, 3]
    assert step.seq_lens.tolist() == [4, 1, 0, 0]
    assert step.slot_ids.tolist() == [3, 5, 9, 9]
    assert step.computed.tolist() == [2, 0, 0, 0]
    assert step.real_tokens == 3 and step.is_padding.dtype is torch.bool
