"""Config switches that plant known bugs in the harness's own system under test (docs/spec.md
§7); the reference behaviour is the default Mutation (harness/config_parts.py) gives each."""

from __future__ import annotations

import enum


class CaptureKey(enum.Enum):
    """Under which token count a microbatched graph is stored (vLLM issue #43145)."""

    TOTAL = "total"  # the sum of every microbatch: the key dispatch looks it up by
    FIRST_TWO = "first-two"  # vLLM V1's bug: the first two microbatches only (k >= 3 misses)


class EagerSlices(enum.Enum):
    """Which microbatch slices a step that replays no FULL graph runs (vLLM PR #29933)."""

    OWN = "own"  # the rank's own requests over the plan's padded tokens: the reference
    GRAPH_PADDED = "graph-padded"  # the bug: requests padded as a graph's, to the synced count


class A2ABuffers(enum.Enum):
    """What the expert all-to-all buffers are sized for (docs/spec.md §5.4)."""

    MAX_TOKENS = "max-tokens"  # max_num_batched_tokens per rank, equal on every rank: reference
    # Sized from the microbatch's own unpadded token count, so ranks whose real tokens differ
    # exchange different sizes (gloo aborts the receiving process).
    UNPADDED = "unpadded"
    # vLLM issue #52176: one microbatch of the largest batch (about half), too small for a
    # step that falls back out of microbatching.
    MICROBATCH = "microbatch"


class UbatchVote(enum.Enum):
    """What a rank's microbatching decision may read (the review of vLLM PR #50945)."""

    SYNCED = "synced"  # the gathered matrix alone: every rank decides the same
    RANK_LOCAL = "rank-local"  # the slip: a rank also opts out on its own request count


class DummyPadding(enum.Enum):
    """What an idle rank's dummy batch runs once the ranks agreed on a step (vLLM #26137)."""

    AGREED = "agreed"  # padded to the agreed tokens, the agreed graph: the reference
    # The bug: the dummy runs at its own size, the graph (or eager run) of its unpadded tokens.
    UNPADDED = "unpadded"


class Guard(enum.Enum):
    """Which empty-microbatch guard the DP sync applies (docs/spec.md §3.2, §7.1-7.2)."""

    FIXED = "fixed"  # eager when min <= (G // k) * (k - 1): the reference behaviour
    MERGED = "merged"  # eager when 2 * min < G: PR #51700 as merged, vllm 0.33.0
    STRICT_K2 = "strict-k2"  # eager when 2 * min <= G: the `<=` fix with the literal 2


class StagingRestore(enum.Enum):
    """Which rows a staged replay reads back into scheduled order (docs/spec.md §3.4); the
    staging policy itself is a serving field (Serving.staging), not a bug."""

    INVERSE = "inverse"  # the rows the staging wrote: the reference
    # The slip: the restore gives each region's extra token to the last regions instead of
    # the first, so rows come back permuted (and padding rows read as real).
    REMAINDER_LAST = "remainder-last"


class StagingVote(enum.Enum):
    """What decides whether a step is staged (docs/spec.md §3.4)."""

    SYNCED = "synced"  # the gathered minimum: every rank decides the same
    # The slip: a rank stages when its own last region would be empty; a peer whose own
    # tokens reach it keeps the fixed guard and falls back to eager.
    RANK_LOCAL = "rank-local"


class CaptureOn(enum.Enum):
    """Which stream a microbatched graph is captured on (docs/spec.md §6.3)."""

    RUNNER = "runner"  # the runner's capture stream, where the microbatch threads launch
    SIDE = "side"  # the draft's bug: a fresh side stream, so the threads' work is not captured


class Twins(enum.Enum):
    """Which microbatched twins the graph table captures (docs/spec.md §7.5)."""

    ALL = "all"  # every eligible twin, as vLLM does (bug §7.5 of docs/spec.md)
    REACHABLE = "reachable"  # only twins some legal batch can dispatch to: the reference


class QueryLenBound(enum.Enum):
    """Which query-length bound a rank dispatches its step with (docs/spec.md §1.6, §7.17)."""

    SYNCED = "synced"  # the max over every rank, none if any rank has a prefill: reference
    # The slip: the rank's own bound, so a decode rank picks a varlen decode graph while a
    # rank with a prefill cannot, and the ranks pad to different token counts.
    RANK_LOCAL = "rank-local"


class SwitchToCompute(enum.Enum):
    """How vLLM's high-throughput all-to-all returns to the compute stream (execution vllm;
    deepep_ht.py's pattern, docs/spec.md §11)."""

    SYNC = "sync"  # dbo_switch_to_compute_sync: compute waits on the comm stream's event
    # The slip: dbo_switch_to_compute, no event, so compute reads the receive unordered
    # (right rows on CPU, a race on a GPU).
    NO_WAIT = "no-wait"


class Continuation(enum.Enum):
    """What a request continued from an earlier microbatch counts as cached (vLLM #56031)."""

    COUNTED = "counted"  # the step's count plus its tokens in earlier microbatches: reference
    # The bug: the step's count alone, stale by the tokens the earlier microbatches ran.
    STALE = "stale"


class LookbackRefresh(enum.Enum):
    """How a replay writes each microbatch's cached-token counts (vLLM #56440)."""

    IN_PLACE = "in-place"  # into the storage the graph captured: the reference
    # The bug: into fresh storage, so the graph reads the counts of an earlier run.
    REBIND = "rebind"


class IdsGatherWait(enum.Enum):
    """When the comm stream that all-gathers the top-k ids waits for the compute stream
    (execution vllm; ROCm/ATOM PR #1208's race, docs/spec.md §11.5)."""

    AFTER_ROUTING = "after-routing"  # on an event recorded once the router wrote the ids
    # The slip: the comm stream was synced at the layer's start, before the router wrote the
    # ids, and nothing orders the write before the gather (right rows on CPU, a race on a GPU).
    BEFORE_ROUTING = "before-routing"


class IdleStep(enum.Enum):
    """What a rank with no scheduled token does in a step (vLLM #43547, #44601, #53578)."""

    DUMMY = "dummy"  # joins the DP sync and runs the agreed dummy batch: the reference
    # The bug: returns early, so it issues none of the step's collectives and drifts.
    SKIP = "skip"


class DummyExecution(enum.Enum):
    """How an idle rank runs the graph its peers replay (ROCm/ATOM #1697)."""

    AGREED = "agreed"  # replays the agreed graph, as its peers do: the reference
    # The bug: the dummy runs eagerly and unsplit, without the collectives baked into the
    # graph its peers replay.
    EAGER = "eager"


class DraftSyncState(enum.Enum):
    """What the DP sync state the drafter reuses may hold (vLLM #53694, #54856)."""

    SYNCED = "synced"  # values every rank computed from the gathered matrix: the reference
    # The slip: a step with drafts keeps the rank's own request count in the reused state.
    RANK_LOCAL = "rank-local"


class ReplayTag(enum.Enum):
    """Where a dispatch's readiness tag comes from (DeepGEMM #451)."""

    PER_RUN = "per-run"  # a device value refreshed in place before every run: the reference
    # The bug: the value the host knew when the graph was captured, baked into it, so every
    # replay ships the tag of an earlier run and it is taken as fresh.
    CAPTURED = "captured"


class VerifySlices(enum.Enum):
    """What the microbatch split counts requests by under adaptive verification, whose
    budget trims drafts after scheduling (docs/spec.md §7.24)."""

    ACTUAL = "actual"  # the tokens each request runs
    # vLLM 0.34.0's create_ubatch_slices: InputBatch.num_scheduled_tokens, the untrimmed upper
    # bound, so a microbatch's request slice can end before a request whose tokens it holds.
    UPPER_BOUND = "upper-bound"


class DeadSet(enum.Enum):
    """Under fault tolerance, which dead DP ranks a rank leaves out of the sync's agreements
    (docs/spec.md §1.7, §7.25)."""

    SHARED = "shared"  # every dead rank some live rank knows of, learnt through the sync
    # vLLM 0.34.0's dp_utils: only those this rank was told of, so a survivor that learns
    # later than another agrees over the dead rank's zero column while the other does not.
    RANK_LOCAL = "rank-local"
