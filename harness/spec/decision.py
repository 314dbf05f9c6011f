"""A second, deliberately plain statement of each rank's step decision, written from
docs/spec.md (§0.3, §1-§4.1) and sharing no code with harness/sut or harness/vllm_sut. The
judge holds the decision code to it (check `spec_decision`); the generator aims with it.

`spec_plans(config, batches)` answers what every rank of the correct system should plan for
one step, from the config's serving fields alone (the staging policy of §3.4 among them): it
reads no field of the Mutation, whose planted bugs (merged or strict-k2 guard, all twins,
threshold offset, rank-local votes and bounds) live in the system under test only, so the
judge flags each one that changes a decision, and any slip no switch selects. Straight loops,
rebuilt for every step, no caching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from harness.batch import RankBatch
from harness.config import CudaGraphMode, HarnessConfig
from harness.history.decision import DpSyncState, GraphDescriptor, Region, StepPlan
from harness.spec.capture import (
    branch_modes,
    capture_sizes,
    drafted_length,
    newest,
    query_lengths,
    varlen_grid,
)

NONE, PIECEWISE, FULL = CudaGraphMode.NONE, CudaGraphMode.PIECEWISE, CudaGraphMode.FULL


# -- §3 thresholds and the guard -------------------------------------------------------------

def thresholds_hold(config: HarnessConfig, n: int, uniform_decode: bool,
                    decode_threshold: int) -> bool:
    """§3.1: inclusive, the decode threshold for a uniform decode, else the prefill one."""
    if not (config.serving.enable_dbo or config.serving.ubatch_size > 1):
        return False
    return n >= (decode_threshold if uniform_decode else config.serving.prefill_threshold)


def guard_says_eager(config: HarnessConfig, min_tokens: int, graph: GraphDescriptor) -> bool:
    """§3.2, the fixed guard whatever the config plants: eager unless the smallest rank
    reaches the last region of the graph's own split (G = the graph's tokens)."""
    k, g = config.num_ubatches, graph.num_tokens
    return min_tokens <= last_region_start(g, k, cut_length(config, graph.uniform_token_count))


def stages(config: HarnessConfig) -> bool:
    """§3.4: whether the system runs the real-token staging policy (a serving choice)."""
    return config.serving.staging


def cut_length(config: HarnessConfig, uct: int | None) -> int | None:
    """§4.1: the request length a split respects: 0.34 only, and only a uniform one."""
    return uct if newest(config) else None


def last_region_start(padded: int, k: int, q: int | None = None) -> int:
    """§4.1: where the last region starts (it takes the rest): after k - 1 regions of
    floor(P/k) tokens, or of floor(P/(qk)) whole requests of q > 1 tokens when one fits."""
    whole = padded // (q * k) if q is not None and q > 1 else 0
    return (whole * q if whole else padded // k) * (k - 1)


def staging_keeps(config: HarnessConfig, graph: GraphDescriptor, min_tokens: int) -> bool:
    """§3.4: staging keeps a twin the fixed guard refuses when every rank can put a real
    one-token request in every region: uct 1 and k <= min <= the last region's start. Every
    rank judges by min, row 0 of the gathered matrix, never by its own count."""
    if not stages(config):
        return False
    k = config.num_ubatches
    return (graph.uniform_token_count == 1
            and k <= min_tokens <= last_region_start(graph.num_tokens, k))


def staged_real_tokens(real: int, padded: int, k: int, region: int) -> int:
    """§3.4: real tokens of a staged rank in a region. Tokens that reach the last region stay
    where they are; fewer are dealt n // k per region, one more in each of the first n % k."""
    start = region * (padded // k)
    end = padded if region == k - 1 else start + padded // k
    if real > last_region_start(padded, k):
        return max(0, min(end, real) - start)
    return real // k + (1 if region < real % k else 0)


# -- §2.1 compatibility, §2.2 the table and dispatch ----------------------------------------

def fits(desc: GraphDescriptor, num_reqs: int, num_tokens: int, uct: int | None,
         max_query_len: int | None, num_ubatches: int) -> bool:
    """The five rules of §2.1, in order."""
    if desc.uniform_token_count is not None and desc.uniform_token_count != uct:
        return False
    if desc.max_query_len is not None and (max_query_len is None
                                           or max_query_len > desc.max_query_len):
        return False
    if desc.num_reqs is not None and desc.num_reqs < num_reqs:
        return False
    if desc.num_tokens < num_tokens:
        return False
    return desc.num_ubatches == num_ubatches


def looked_up_first(config: HarnessConfig, desc: GraphDescriptor) -> bool:
    """§2.6 (0.34): a uniform decode graph of a separate decode routine is looked up by its
    query length and request count before any graph keyed by tokens."""
    decode_mode, _ = branch_modes(config.serving.cudagraph_mode)
    return (newest(config) and decode_mode is not None and desc.cg_mode is decode_mode
            and desc.uniform_token_count is not None)


def dispatch(config: HarnessConfig, table: Sequence[GraphDescriptor], num_reqs: int,
             num_tokens: int, uct: int | None, max_query_len: int | None = None,
             num_ubatches: int = 1) -> GraphDescriptor:
    """§2.2 rule 6 with the order of rule 5 (0.34: request-keyed decode graphs first): the
    best compatible graph, else NONE carrying the request. Ties keep the table's order."""
    best, best_key = None, None
    if num_tokens > 0:
        for desc in table:
            if not fits(desc, num_reqs, num_tokens, uct, max_query_len, num_ubatches):
                continue
            key = (0 if looked_up_first(config, desc) else 1,
                   0 if desc.cg_mode is FULL else 1, desc.num_tokens,
                   desc.uniform_token_count is None, desc.max_query_len is None,
                   desc.num_reqs is None, desc.num_reqs or 0)
            if best_key is None or key < best_key:
                best, best_key = desc, key
    if best is None:
        return GraphDescriptor(NONE, num_tokens, num_reqs, num_ubatches=num_ubatches)
    return best


def twin_of(config: HarnessConfig, desc: GraphDescriptor,
            decode_threshold: int) -> GraphDescriptor | None:
    """§2.2 rule 1: the k-way twin of a FULL descriptor with padded requests, if eligible."""
    if not (config.serving.enable_dbo or config.serving.ubatch_size > 1):
        return None
    if desc.cg_mode is not FULL or desc.num_reqs is None:
        return None
    if desc.num_tokens % desc.num_reqs != 0:
        return None
    uct = desc.num_tokens // desc.num_reqs
    if desc.uniform_token_count is not None and desc.uniform_token_count != uct:
        return None
    if desc.num_tokens < config.num_ubatches:
        return None
    if not thresholds_hold(config, desc.num_tokens, True, decode_threshold):
        return None
    return GraphDescriptor(FULL, desc.num_tokens, desc.num_reqs, uct, desc.max_query_len,
                           config.num_ubatches)


def graph_table(config: HarnessConfig) -> list[GraphDescriptor]:
    """§2.2 rules 1-3, the same on every rank: candidates per size, then only the twins a
    legal all-ranks-equal uniform decode reaches."""
    decode_threshold = config.serving.decode_threshold
    if newest(config):
        table = table_by_requests(config, decode_threshold)
    else:
        table = table_by_tokens(config, decode_threshold)
    kept = []
    for desc in table:
        if desc.num_ubatches == 1 or reached(config, table, desc):
            kept.append(desc)
    return kept


def table_by_tokens(config: HarnessConfig, decode_threshold: int) -> list[GraphDescriptor]:
    """§2.2 rules 1-2 as 0.33 generates them: per capture size, decode branch then mixed."""
    decode_mode, mixed_mode = branch_modes(config.serving.cudagraph_mode)
    q = config.serving.decode_query_len
    sizes = capture_sizes(config)
    largest = max(sizes, default=0)
    table: list[GraphDescriptor] = []
    for s in sizes:
        if decode_mode is not None and config.serving.varlen_decode:
            # §2.2 rule 2, varlen: one graph per size up to the decode limit, taking any mix
            # of 1..q tokens per request, bounded by max_query_len = q instead of a uct.
            if s <= config.serving.max_num_reqs * q:
                table.append(GraphDescriptor(decode_mode, s, min(s, config.serving.max_num_reqs),
                                             max_query_len=q))
        elif decode_mode is not None:
            tokens = ((s + q - 1) // q) * q
            reqs = tokens // q
            if (tokens <= config.serving.max_num_reqs * q and tokens <= largest
                    and reqs <= config.serving.max_num_reqs):
                base = GraphDescriptor(decode_mode, tokens, reqs, uniform_token_count=q)
                for desc in (base, twin_of(config, base, decode_threshold)):
                    if desc is not None and desc not in table:  # duplicates skipped here only
                        table.append(desc)
        if mixed_mode is not None:
            reqs = min(s, config.serving.max_num_reqs) if mixed_mode is FULL else None
            base = GraphDescriptor(mixed_mode, s, reqs)
            table.append(base)
            twin = twin_of(config, base, decode_threshold)
            if twin is not None:
                table.append(twin)
    return table


def table_by_requests(config: HarnessConfig, decode_threshold: int) -> list[GraphDescriptor]:
    """§2.6 as 0.34 generates it: decode graphs of n requests x q tokens with their twins (or
    varlen decode graphs by tokens), then every capture size's mixed graph and its twin."""
    decode_mode, mixed_mode = branch_modes(config.serving.cudagraph_mode)
    q, cap = config.serving.decode_query_len, config.serving.max_num_reqs
    sizes = capture_sizes(config)
    largest = max(sizes, default=0)
    counts = sorted({min((s + q - 1) // q, cap) for s in sizes if (s + q - 1) // q * q <= largest})
    table: list[GraphDescriptor] = []
    if decode_mode is not None and config.serving.varlen_decode:
        for t in varlen_grid(min(max(counts, default=0) * q,
                                 config.serving.max_num_batched_tokens)):
            table.append(GraphDescriptor(decode_mode, t, min(t, cap), max_query_len=q))
    elif decode_mode is not None:
        for length, most in sorted(query_lengths(config)):
            limit = min(most, largest // length)
            requests = []
            for n in counts if limit >= 1 else []:
                if min(n, limit) not in requests:
                    requests.append(min(n, limit))
                if n >= limit:
                    break
            for n in requests:
                base = GraphDescriptor(decode_mode, n * length, n, uniform_token_count=length)
                table += [d for d in (base, twin_of(config, base, decode_threshold)) if d]
    for s in sizes if mixed_mode is not None else []:
        base = GraphDescriptor(mixed_mode, s, min(s, cap) if mixed_mode is FULL else None)
        table += [d for d in (base, twin_of(config, base, decode_threshold)) if d]
    return table


def reached(config: HarnessConfig, table: Sequence[GraphDescriptor],
            twin: GraphDescriptor) -> bool:
    """§2.2 rule 3: the easiest legal batch, every rank at n tokens of uniform decodes of the
    twin's length q; only the widest q counts as a uniform decode for the thresholds (§1.6)."""
    q = twin.uniform_token_count
    # A request drafts at most what the schedule gives its batch size (§1.6), maybe fewer.
    most = 0
    for b in range(1, config.serving.max_num_reqs + 1):
        if q is not None and q <= drafted_length(config, b):
            most = b
    if most == 0:
        return False
    n = min(twin.num_tokens, most * q, config.serving.max_num_batched_tokens)
    n -= n % q
    if n < 1 or not thresholds_hold(config, n, q == config.serving.decode_query_len,
                                    config.serving.decode_threshold):
        return False
    if dispatch(config, table, n // q, n, q, num_ubatches=config.num_ubatches) != twin:
        return False
    return not guard_says_eager(config, n, twin)


# -- §1 the DP sync and §2.4 / §4.1 the plan -------------------------------------------------

def spec_plans(config: HarnessConfig, batches: Sequence[RankBatch]) -> list[StepPlan]:
    """Every rank's plan for one step: the gathered matrix of §1.1, each rank's decision of
    §1.3 from it and its own batch, then padding (§2.4) and regions (§4.1)."""
    table = graph_table(config)
    # §1.1 rows, column r from rank r alone; the vote is the rank's own unsplit dispatch.
    # An idle rank brings vLLM's dummy batch: one request of q tokens, a uniform decode.
    q = config.serving.decode_query_len
    deciding = [b if b.num_tokens else RankBatch(q, 1, q, b.allow_ubatching, (q,), q,
                                                 b.allow_skip_drafts) for b in batches]
    tokens, votes, ucts, max_query_lens, allows, reqs = [], [], [], [], [], []
    # §1.7: a dead rank writes nothing (its column reads zero); every rank leaves out the
    # columns of the dead ranks any live rank was told of.
    told = {d for b in batches if not b.dead for d in b.knows_dead}
    live = [r for r in range(len(batches)) if r not in told]
    # §1.6: drafts are skipped only when every rank allows it.
    skip = all(deciding[r].allow_skip_drafts and not batches[r].dead for r in live)
    for rank, batch in enumerate(deciding):
        if batches[rank].dead:
            for column in (tokens, votes, ucts, max_query_lens, allows, reqs):
                column.append(0)
            continue
        tokens.append(batch.num_tokens)
        votes.append(dispatch(config, table, batch.num_reqs, batch.num_tokens,
                              batch.uniform_token_count, batch.max_query_len).cg_mode.value)
        ucts.append(batch.uniform_token_count or 0)
        max_query_lens.append(-1 if batch.max_query_len is None else batch.max_query_len)
        allows.append(1 if batch.allow_ubatching else 0)
        reqs.append(batch.num_reqs)
    plans = []
    for rank, batch in enumerate(batches):
        desc, state = decide(config, table, deciding[rank],
                             *([column[r] for r in live] for column in
                               (tokens, votes, ucts, max_query_lens, allows, reqs)))
        if state is not None:
            state = replace(state, skip_drafts=skip)
        if state is not None and told:  # §1.7: the counts returned keep every slot
            unsplit_eager = desc.cg_mode is NONE and desc.num_ubatches == 1
            state = replace(state, num_tokens_across_dp=tuple(tokens) if unsplit_eager
                            else (desc.num_tokens,) * len(tokens),
                            staged_tokens=state.staged_tokens and tuple(tokens))
        plans.append(pad_and_split(config, rank, batch, desc, state))
    return plans


def decide(config: HarnessConfig, table: Sequence[GraphDescriptor], batch: RankBatch,
           tokens: list[int], votes: list[int], ucts: list[int], max_query_lens: list[int],
           allows: list[int], reqs: list[int]) -> tuple[GraphDescriptor, DpSyncState | None]:
    """§1.2-§1.3 for one rank: the descriptor and the DP state (the decision table §2.3)."""
    dp, k, q = len(tokens), config.num_ubatches, config.serving.decode_query_len
    # §1.2: synced values come from every column, never from one rank's.
    synced_uct = ucts[0] if ucts[0] != 0 and all(u == ucts[0] for u in ucts) else None
    own_uct = batch.uniform_token_count or 0
    uniform_decode = own_uct == q and all(u == own_uct for u in ucts)
    min_tokens, max_tokens, max_reqs = min(tokens), max(tokens), max(reqs)
    # 2: thresholds are monotone in n, so they are tested on the smallest rank (§3.1); the
    # vote is the gathered one alone, never this rank's own request count (§7.15).
    if all(a == 1 for a in allows) and thresholds_hold(
            config, min_tokens, uniform_decode, config.serving.decode_threshold):
        desc, staged = None, False
        if config.serving.cudagraph_mode is not NONE:  # 2a: a k-way dispatch of the largest rank
            graph = dispatch(config, table, batch.num_reqs, max_tokens, synced_uct,
                             num_ubatches=k)
            # a k-way dispatch only ever answers a twin or NONE at max_tokens (§2.3 note)
            if graph.cg_mode is not NONE:
                staged = staging_keeps(config, graph, min_tokens)
                if staged or not guard_says_eager(config, min_tokens, graph):
                    desc = graph
        if desc is None:  # 2b / T2: split eagerly at the largest rank's size
            desc = GraphDescriptor(NONE, max_tokens, batch.num_reqs, num_ubatches=k)
        state_reqs = desc.num_reqs if desc.cg_mode is FULL else max_reqs  # 2c
        return desc, DpSyncState((desc.num_tokens,) * dp, synced_uct,
                                 eager=desc.cg_mode is NONE, num_reqs=state_reqs,
                                 staged_tokens=tuple(tokens) if staged else None)
    if min(votes) == NONE.value:  # 3 / T3: someone votes eager, nobody pads
        return (GraphDescriptor(NONE, batch.num_tokens, batch.num_reqs),
                DpSyncState(tuple(tokens), synced_uct, eager=True, num_reqs=max_reqs))
    # 4 / T4-T6: one unsplit dispatch of the largest rank; no graph means eager at max.
    # The query-length bound is the synced one, none if any rank has a prefill (§7.17).
    synced_mql = None if -1 in max_query_lens else max(max_query_lens)
    desc = dispatch(config, table, batch.num_reqs, max_tokens, synced_uct, synced_mql)
    state_reqs = desc.num_reqs if desc.cg_mode is FULL else max_reqs
    return desc, DpSyncState((desc.num_tokens,) * dp, synced_uct, eager=False,
                             num_reqs=state_reqs)


def pad_and_split(config: HarnessConfig, rank: int, batch: RankBatch, desc: GraphDescriptor,
                  state: DpSyncState | None) -> StepPlan:
    """§2.4: pad to max(N_r, G) tokens and to the descriptor's requests when it sets them;
    §4.1: a split step gets k regions, the last taking the rest. A FULL replay cuts as its
    graph was captured, an eager split by the synced uniform length."""
    real = batch.num_tokens
    padded = max(real, desc.num_tokens)
    num_reqs = batch.num_reqs if desc.num_reqs is None else desc.num_reqs
    regions = []
    staged = state is not None and state.staged_tokens is not None
    if desc.num_ubatches > 1:
        k = desc.num_ubatches
        uct = desc.uniform_token_count if desc.cg_mode is FULL or state is None \
            else state.uniform_token_count
        size = last_region_start(padded, k, cut_length(config, uct)) // (k - 1)
        for i in range(k):
            start = i * size
            end = padded if i == k - 1 else start + size
            held = (staged_real_tokens(real, padded, k, i) if staged
                    else max(0, min(end, real) - start))
            regions.append(Region(end - start, held))
    return StepPlan(rank, desc, state, padded, num_reqs, real, tuple(regions))
