"""The buffer work of a staged replay (docs/spec.md §3.4): real tokens written into every
region of the twin's persistent buffers before the replay, and the scheduled order restored
after it, output rows and inputs alike.

The staged layout is the captured dummy's (one one-token request per row) with the rank's
real requests at their staged rows, so the replay's request split is the captured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.bug_switches import StagingRestore
from harness.config import CudaGraphMode
from harness.history.decision import StepPlan
from harness.model.state import RequestSpec
from harness.model.step_buffers import StepBuffers
from harness.sut.staging import block_rows, is_staged, staged_rows
from harness.sut.thresholds import every_region_gets_a_real_token


@dataclass(frozen=True)
class StagedLayout:
    """Where a rank's real tokens sit in a staged replay of a twin of `graph_tokens`."""

    rows: tuple[int, ...]  # the row of each real token, in scheduled order
    graph_tokens: int
    num_ubatches: int


def staged_layout(plan: StepPlan) -> StagedLayout | None:
    """The layout of a plan that replays its twin staged; None for any other plan."""
    if not is_staged(plan) or plan.desc.cg_mode is not CudaGraphMode.FULL:
        return None
    desc = plan.desc
    return StagedLayout(staged_rows(plan.real_tokens, desc.num_tokens, desc.num_ubatches),
                        desc.num_tokens, desc.num_ubatches)


def stage(buffers: StepBuffers, requests: Sequence[RequestSpec], layout: StagedLayout,
          scratch_slot: int) -> tuple[int, ...]:
    """Fill the buffers with one request per row, the real ones at their staged rows and a
    one-token padding request on every other row; returns the query lengths to split by."""
    if len(requests) != len(layout.rows) or any(r.query_len != 1 for r in requests):
        raise ValueError("staging lays out one-token requests only, one per staged row")
    staged = [RequestSpec(scratch_slot, 0, (0,))] * layout.graph_tokens
    for request, row in zip(requests, layout.rows, strict=True):
        staged[row] = request
    buffers.fill(staged)
    padding = torch.ones(layout.graph_tokens, dtype=torch.bool)
    padding[list(layout.rows)] = False
    buffers.is_padding.copy_(padding)
    buffers.real_tokens = None  # the real tokens are no prefix of the rows any more
    return (1,) * layout.graph_tokens


def restored_rows(layout: StagedLayout, how: StagingRestore) -> tuple[int, ...]:
    """The rows the restore reads back, in scheduled order: the staging's own, or with
    staging_restore remainder-last (the slip of §3.4) blocks that give their extra tokens
    to the last regions."""
    n, graph, k = len(layout.rows), layout.graph_tokens, layout.num_ubatches
    if how is StagingRestore.INVERSE or every_region_gets_a_real_token(n, graph, k):
        return layout.rows
    return block_rows(n, graph, k, extra_first=False)


def restore(buffers: StepBuffers, requests: Sequence[RequestSpec], layout: StagedLayout,
            how: StagingRestore) -> None:
    """After the replay: the real rows back at the front of the output in scheduled order,
    and the inputs (ids, positions, slots, padding flags) refilled as scheduled, for whatever
    reads them after the step (vLLM's sampler)."""
    rows = restored_rows(layout, how)
    index = torch.tensor(rows, dtype=torch.int64, device=buffers.output.device)
    buffers.output[:len(rows)].copy_(buffers.output.index_select(0, index))
    buffers.fill(requests)
