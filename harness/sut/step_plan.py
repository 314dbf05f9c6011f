"""What one rank will run for a step, derived from its sync decision and its own batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from harness.batch import RankBatch
from harness.config import CudaGraphMode, HarnessConfig
from harness.sut.descriptor import GraphDescriptor
from harness.sut.dp_sync import (
    DpSyncState,
    SyncDecision,
    decide_from_matrix,
    gathered_rows,
    sync_dp,
)
from harness.sut.graph_table import GraphTable
from harness.sut.slicing import Region, regions


@dataclass(frozen=True)
class StepPlan:
    rank: int
    desc: GraphDescriptor
    state: DpSyncState | None
    num_tokens: int  # after DP and graph padding
    num_reqs: int  # after request padding (FULL graphs pad requests)
    real_tokens: int
    regions: tuple[Region, ...]  # one per microbatch; empty when not microbatched

    @property
    def eager(self) -> bool:
        return self.state is None or self.state.eager

    @property
    def uniform_token_count(self) -> int | None:
        return self.state.uniform_token_count if self.state else self.desc.uniform_token_count

    @property
    def kind(self) -> str:
        """eager | eager-microbatched | piecewise | full | full-microbatched."""
        mode = self.desc.cg_mode
        if mode is CudaGraphMode.NONE:
            return "eager-microbatched" if self.desc.microbatched else "eager"
        if mode is CudaGraphMode.PIECEWISE:
            return "piecewise"
        return "full-microbatched" if self.desc.microbatched else "full"

    def agreement_key(self) -> dict[str, object]:
        """The fields every rank must share (invariants 1, 2 and 4 of dbo-reference 11).

        An eager descriptor keeps the rank's own request count, and a plain eager step also
        its own token count (nothing is padded), so those are left out there.
        """
        desc = self.desc
        return {
            "cg_mode": desc.cg_mode.name,
            "num_tokens": None if self.kind == "eager" else desc.num_tokens,
            "num_ubatches": desc.num_ubatches,
            "uniform_token_count": desc.uniform_token_count,
            "graph_num_reqs": None if desc.cg_mode is CudaGraphMode.NONE else desc.num_reqs,
            "dp_sync": self.state,
            "region_sizes": tuple(r.tokens for r in self.regions),
        }


def plan_step(rank: int, batch: RankBatch, decision: SyncDecision) -> StepPlan:
    desc = decision.desc
    num_tokens = max(batch.num_tokens, desc.num_tokens)
    num_reqs = desc.num_reqs or batch.num_reqs
    rank_regions = (regions(num_tokens, batch.num_tokens, desc.num_ubatches)
                    if desc.microbatched else ())
    return StepPlan(rank, desc, decision.state, num_tokens, num_reqs, batch.num_tokens,
                    rank_regions)


def decide_on_rank(group, config: HarnessConfig, rank: int, batch: RankBatch,
                   timeout_s: float) -> StepPlan:
    """The rank code of the decision phase: the DP sync, then this rank's padding and split."""
    decision = sync_dp(group, config, graph_table_for(config, rank), rank, batch, timeout_s)
    return plan_step(rank, batch, decision)


@lru_cache(maxsize=64)
def graph_table_for(config: HarnessConfig, rank: int) -> GraphTable:
    return GraphTable.build(config, rank)


def plan_without_world(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    """Every rank's plan from the matrix the all-reduce would gather, with no world at all.

    Same decision code as `decide_on_rank`; for exhaustive enumeration and property tests.
    """
    tables = [graph_table_for(config, rank) for rank in range(config.dp_size)]
    rows = gathered_rows(tables, batches)
    return [plan_step(rank, batch, decide_from_matrix(config, tables[rank], rows, batch))
            for rank, batch in enumerate(batches)]
