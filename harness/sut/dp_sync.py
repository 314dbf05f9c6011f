"""The DP synchronisation of one step (docs/spec.md §1).

Each rank writes its column of a small per-rank matrix, one SUM all-reduce on a CPU (gloo)
group turns it into an all-gather, and every rank then derives the same decision from the
gathered matrix with `decide_from_matrix`, a pure function. Other ranks' microbatching votes
are deduced from their token counts, never communicated, so the deduction must be pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from harness.batch import RankBatch, deciding_batch
from harness.bug_switches import DeadSet, DraftSyncState, QueryLenBound, UbatchVote
from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import DpSyncState, GraphDescriptor
from harness.runtime.comm import CollectiveLog, all_reduce_sum
from harness.sut.graph_table import GraphTable
from harness.sut.slicing import split_uct_of
from harness.sut.staging import stages_step
from harness.sut.thresholds import guard_sends_to_eager, ubatch_thresholds_met

# Rows of the gathered matrix, in local_column's order; column r is rank r's contribution.
# Named where tests read them; rows 3 (max query len) and 6 (skip-drafts vote) are not.
ROW_TOKENS, ROW_CG_MODE, ROW_UCT, ROW_ALLOW_UBATCH, ROW_NUM_REQS = 0, 1, 2, 4, 5
NUM_ROWS = 7


def rows_of(config: HarnessConfig) -> int:
    """The matrix's rows: under fault tolerance one more per rank, row NUM_ROWS + d holding
    in column r whether rank r has been told rank d is dead (docs/spec.md §1.7)."""
    return NUM_ROWS + (config.serving.dp_size if config.serving.fault_tolerance else 0)


@dataclass(frozen=True)
class SyncDecision:
    desc: GraphDescriptor
    state: DpSyncState | None  # None when the sync gave no state


def local_column(table: GraphTable, batch: RankBatch) -> tuple[int, ...]:
    """This rank's column: tokens, graph-mode vote, uct, max query len (-1: a prefill), allow,
    requests, skip-drafts vote (an idle rank's from its dummy batch); under fault tolerance,
    the dead ranks it knows of. A dead rank writes nothing: its column reads zero."""
    config = table.config
    if batch.dead:
        return (0,) * rows_of(config)
    batch = deciding_batch(batch, config.serving.decode_query_len)
    vote = table.dispatch(batch.num_reqs, batch.num_tokens, batch.uniform_token_count,
                          batch.max_query_len).cg_mode
    max_query_len = batch.max_query_len
    told = tuple(int(d in batch.knows_dead) for d in range(rows_of(config) - NUM_ROWS))
    return (batch.num_tokens, vote.value, batch.uniform_token_count or 0,
            -1 if max_query_len is None else max_query_len, int(batch.allow_ubatching),
            batch.num_reqs, int(batch.allow_skip_drafts), *told)


def dead_left_out(config: HarnessConfig, rows: Sequence[Sequence[int]],
                  batch: RankBatch) -> frozenset[int]:
    """The ranks whose columns this rank leaves out of the agreements: every dead rank a
    live rank was told of, as the matrix shares it; with dead_set rank-local (vLLM 0.34.0,
    §7.25) only those this rank was told of itself."""
    if config.mutation.dead_set is DeadSet.RANK_LOCAL:
        return frozenset(batch.knows_dead)
    return frozenset(d for d, told in enumerate(rows[NUM_ROWS:]) if any(told))


def live_rows(config: HarnessConfig, rows: Sequence[Sequence[int]],
              batch: RankBatch) -> list[list[int]]:
    """The seven agreement rows over the columns this rank agrees over (§1.7)."""
    left_out = dead_left_out(config, rows, batch)
    return [[v for r, v in enumerate(row) if r not in left_out] for row in rows[:NUM_ROWS]]


def decide_from_matrix(config: HarnessConfig, table: GraphTable,
                       rows: Sequence[Sequence[int]], batch: RankBatch) -> SyncDecision:
    """The decision of one rank from the gathered matrix and its own (or dummy) batch."""
    batch = deciding_batch(batch, config.serving.decode_query_len)
    # The returned token counts keep every rank's slot, a dead one's too (§1.7).
    full_tokens = tuple(rows[ROW_TOKENS])
    tokens, votes, ucts, max_query_lens, allows, reqs, skips = live_rows(config, rows, batch)
    local_uct = batch.uniform_token_count or 0
    synced_uct = ucts[0] if ucts[0] != 0 and all(u == ucts[0] for u in ucts) else None
    skip_drafts = all(s == 1 for s in skips)
    if all(a == 1 for a in allows):
        uniform_decode = (batch.uniform_token_count == config.serving.decode_query_len
                          and all(u == local_uct for u in ucts))
        min_tokens = min(tokens)
        if ubatch_thresholds_met(config, min_tokens, uniform_decode) and not (
                opts_out_alone(config, batch)):
            return _microbatched(config, table, tokens, reqs, batch, synced_uct, skip_drafts,
                                 full_tokens)

    synced_mode = CudaGraphMode(min(votes))
    if synced_mode is CudaGraphMode.NONE:
        desc = GraphDescriptor(CudaGraphMode.NONE, batch.num_tokens, batch.num_reqs)
        state = DpSyncState(full_tokens, synced_uct, eager=True, num_reqs=max(reqs),
                            skip_drafts=skip_drafts)
        return SyncDecision(desc, drafter_state(config, state, batch))
    # Varlen decode graphs are chosen by the bound, so every rank dispatches with the synced
    # one: the largest, or none when some rank has a prefill (docs/spec.md §1.6).
    synced_max_query_len = None if -1 in max_query_lens else max(max_query_lens)
    if config.mutation.query_len_bound is QueryLenBound.RANK_LOCAL:
        synced_max_query_len = batch.max_query_len  # the slip of §7.17
    desc = table.dispatch(batch.num_reqs, max(tokens), synced_uct, synced_max_query_len)
    num_reqs = desc.num_reqs if desc.cg_mode is CudaGraphMode.FULL else max(reqs)
    state = DpSyncState((desc.num_tokens,) * len(full_tokens), synced_uct, eager=False,
                        num_reqs=num_reqs, skip_drafts=skip_drafts)
    return SyncDecision(desc, drafter_state(config, state, batch))


def drafter_state(config: HarnessConfig, state: DpSyncState, batch: RankBatch) -> DpSyncState:
    """The state the drafter's step reuses; with draft_sync_state rank-local (vLLM #53694,
    #54856), a step that drafts keeps this rank's own request count in it."""
    drafts = config.serving.decode_query_len > 1 and not state.skip_drafts
    if config.mutation.draft_sync_state is DraftSyncState.RANK_LOCAL and drafts:
        return replace(state, num_reqs=batch.num_reqs)
    return state


def opts_out_alone(config: HarnessConfig, batch: RankBatch) -> bool:
    """ubatch_vote rank-local: a rank with fewer requests than microbatches leaves the split
    on its own, a value no other rank consults (vLLM PR #50945's review: a deadlock)."""
    return (config.mutation.ubatch_vote is UbatchVote.RANK_LOCAL
            and batch.num_reqs < config.num_ubatches)


def _microbatched(config: HarnessConfig, table: GraphTable, tokens: list[int], reqs: list[int],
                  batch: RankBatch, synced_uct: int | None, skip_drafts: bool,
                  full_tokens: tuple[int, ...]) -> SyncDecision:
    # Once the threshold holds on the minimum the step is always split k ways; the only
    # choice left is a FULL twin graph or an eager microbatched run.
    k = config.num_ubatches
    largest, smallest = max(tokens), min(tokens)
    desc: GraphDescriptor | None = None
    staged = False
    if config.serving.cudagraph_mode is not CudaGraphMode.NONE:
        desc = table.dispatch(batch.num_reqs, largest, synced_uct, num_ubatches=k)
        # The staging policy keeps a twin the guard refuses when staging fills it (§3.4).
        staged = stages_step(config, tokens, batch.num_tokens, desc)
        if not staged and guard_sends_to_eager(config.mutation.guard, smallest,
                                               desc.num_tokens, k,
                                               split_uct_of(config, desc, None)):
            desc = None
    if desc is None:
        desc = GraphDescriptor(CudaGraphMode.NONE, largest, batch.num_reqs, num_ubatches=k)
    num_reqs = max(reqs)
    if desc.cg_mode is CudaGraphMode.FULL:
        assert desc.num_reqs is not None, "a FULL graph always pads requests"
        num_reqs = desc.num_reqs
    state = DpSyncState((desc.num_tokens,) * len(full_tokens), synced_uct,
                        eager=desc.cg_mode is CudaGraphMode.NONE, num_reqs=num_reqs,
                        skip_drafts=skip_drafts,
                        staged_tokens=full_tokens if staged else None)
    return SyncDecision(desc, state)


def sync_dp(group, config: HarnessConfig, table: GraphTable, rank: int, batch: RankBatch,
            timeout_s: float, log: CollectiveLog | None = None) -> SyncDecision:
    """Run the DP sync for this rank over `group` (a gloo process group of dp_size ranks)."""
    matrix = torch.zeros(rows_of(config), config.serving.dp_size, dtype=torch.int32)
    matrix[:, rank] = torch.tensor(local_column(table, batch), dtype=torch.int32)
    all_reduce_sum(group, matrix, timeout_s, log)
    return decide_from_matrix(config, table, matrix.tolist(), batch)


def gathered_rows(tables: Sequence[GraphTable], batches: Sequence[RankBatch]) -> list[list[int]]:
    """The matrix the all-reduce produces, computed directly from every rank's inputs."""
    return gather_columns([local_column(t, b) for t, b in zip(tables, batches, strict=True)])


def gather_columns(columns: Sequence[Sequence[int]]) -> list[list[int]]:
    """The gathered matrix from every rank's column, rank r in column r."""
    return [list(row) for row in zip(*columns, strict=True)]
