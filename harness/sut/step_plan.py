"""What one rank will run for a step, derived from its sync decision and its own batch."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from harness.batch import RankBatch
from harness.config import HarnessConfig
from harness.history.decision import StepPlan
from harness.runtime.comm import CollectiveLog
from harness.sut.dp_sync import SyncDecision, decide_from_matrix, gathered_rows, sync_dp
from harness.sut.graph_table import GraphTable
from harness.sut.slicing import regions, split_uct_of
from harness.sut.staging import staged_regions


def plan_step(config: HarnessConfig, rank: int, batch: RankBatch,
              decision: SyncDecision) -> StepPlan:
    desc = decision.desc
    num_tokens = max(batch.num_tokens, desc.num_tokens)
    num_reqs = desc.num_reqs or batch.num_reqs
    rank_regions = (regions(num_tokens, batch.num_tokens, desc.num_ubatches,
                            split_uct_of(config, desc, decision.state))
                    if desc.microbatched else ())
    if decision.state is not None and decision.state.staged_tokens is not None:
        # A staged step's regions count the real tokens its layout puts there (§3.4).
        rank_regions = staged_regions(batch.num_tokens, desc.num_tokens, desc.num_ubatches)
    return StepPlan(rank, desc, decision.state, num_tokens, num_reqs, batch.num_tokens,
                    rank_regions)


def decide_on_rank(group, config: HarnessConfig, rank: int, batch: RankBatch,
                   timeout_s: float, log: CollectiveLog | None = None) -> StepPlan:
    """The rank code of the decision phase: the DP sync, then this rank's padding and split."""
    decision = sync_dp(group, config, graph_table_for(config, rank), rank, batch, timeout_s,
                       log)
    return plan_step(config, rank, batch, decision)


@lru_cache(maxsize=64)
def graph_table_for(config: HarnessConfig, rank: int) -> GraphTable:
    return GraphTable.build(config, rank)


def plan_without_world(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    """Every rank's plan from the matrix the all-reduce would gather, with no world at all.

    Same decision code as `decide_on_rank`; for exhaustive enumeration and property tests.
    """
    tables = [graph_table_for(config, rank) for rank in range(config.serving.dp_size)]
    rows = gathered_rows(tables, batches)
    return [plan_step(config, rank, batch, decide_from_matrix(config, tables[rank], rows, batch))
            for rank, batch in enumerate(batches)]
