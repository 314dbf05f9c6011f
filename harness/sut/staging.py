"""Real-token staging (docs/spec.md §3.4): under the `staging` policy, a split step that the fixed
guard would send to eager keeps its microbatched graph, every rank laying its real tokens
over every region of the twin.

Everything here is a pure function of the gathered matrix, the config and the descriptor, so
every rank decides alike and can compute any peer's layout (the route restore needs them).
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.bug_switches import StagingVote
from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import GraphDescriptor, Region, StepPlan
from harness.sut.slicing import region_bounds
from harness.sut.thresholds import every_region_gets_a_real_token

Route = tuple[int, int, int]  # (source rank, token index in that rank's step, expert)


def can_stage(min_tokens: int, desc: GraphDescriptor) -> bool:
    """Every rank can put a whole real request into every region: the twin serves one-token
    requests (so it has a request per token) and the smallest rank has one per region."""
    return desc.uniform_token_count == 1 and min_tokens >= desc.num_ubatches


def stages_step(config: HarnessConfig, tokens: Sequence[int], own_tokens: int,
                desc: GraphDescriptor) -> bool:
    """Whether the step keeps the twin `desc` by staging: staging on, the fixed guard would
    send it to eager, and staging is possible. Judged on the gathered minimum; with
    staging_vote rank-local (the slip of §3.4) on this rank's own count."""
    if (not config.serving.staging or desc.cg_mode is not CudaGraphMode.FULL
            or not desc.microbatched):
        return False
    judged = (own_tokens if config.mutation.staging_vote is StagingVote.RANK_LOCAL
              else min(tokens))
    return (not every_region_gets_a_real_token(judged, desc.num_tokens, desc.num_ubatches)
            and can_stage(judged, desc))


def block_rows(real_tokens: int, graph_tokens: int, num_ubatches: int,
               extra_first: bool = True) -> tuple[int, ...]:
    """Rows of `real_tokens` spread evenly in scheduled order: region i takes the next
    n // k tokens at its start, one more for each of the first n % k regions (`extra_first`
    false: the last ones instead, the restore slip's layout)."""
    size, k = graph_tokens // num_ubatches, num_ubatches
    base, extra = divmod(real_tokens, k)
    rows: list[int] = []
    for i in range(k):
        more = i < extra if extra_first else i >= k - extra
        rows.extend(range(i * size, i * size + base + int(more)))
    return tuple(rows)


def staged_rows(real_tokens: int, graph_tokens: int, num_ubatches: int) -> tuple[int, ...]:
    """The row each real token of a rank takes in a staged step, in scheduled order: a rank
    whose tokens already reach the last region keeps them in place; the others spread."""
    if every_region_gets_a_real_token(real_tokens, graph_tokens, num_ubatches):
        return tuple(range(real_tokens))
    return block_rows(real_tokens, graph_tokens, num_ubatches)


def staged_regions(real_tokens: int, graph_tokens: int,
                   num_ubatches: int) -> tuple[Region, ...]:
    """The rank's regions of a staged step, counting the real tokens its layout puts in each."""
    rows = staged_rows(real_tokens, graph_tokens, num_ubatches)
    return tuple(Region(end - start, sum(start <= row < end for row in rows))
                 for start, end in region_bounds(graph_tokens, num_ubatches))


def is_staged(plan: StepPlan | None) -> bool:
    return plan is not None and plan.state is not None and plan.state.staged_tokens is not None


def scheduled_routes(routes: Sequence[Route], plan: StepPlan) -> tuple[Route, ...]:
    """Received routes of a staged replay with each source's staged row turned back into its
    scheduled token index, from that source's layout (a row no real token took keeps its
    index: a padding row that was routed stays visible as one)."""
    desc, staged = plan.desc, plan.state.staged_tokens
    back = [{row: token for token, row in enumerate(staged_rows(n, desc.num_tokens,
                                                                desc.num_ubatches))}
            for n in staged]
    return tuple(sorted((src, back[src].get(tok, tok), expert) for src, tok, expert in routes))
