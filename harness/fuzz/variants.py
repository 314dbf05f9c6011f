"""The systems the fuzzer can be pointed at: the reference, and one variant per known bug.

A variant plants its bug as a Mutation of the system under test (and, for protocol bugs, the
faults that trigger them), apart from the setting it runs on; the fuzzer is told nothing else.
Each names the checkers that catch it, so a detection counts only when the bug shows as itself.
A bug in the harness's decisions names spec_decision last: the spec plans without it, so a
decision that differs from the spec's is that bug showing (its consequence preferred).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from hypothesis import strategies as st

from harness.config_parts import Mutation, System, wire_value
from harness.errors import ConfigError
from harness.faults import VLLM_EXEC_FAULTS, FaultKind
from harness.gen.strategies import SIZE_CHOICES


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    mutation: Mutation = Mutation()  # the bug it plants; Mutation() plants none
    # What it runs on, apart from its bug (flat config fields): vLLM's decisions or execution.
    setting: tuple[tuple[str, Any], ...] = ()
    # The fields of `setting` whose vLLM code it hunts bugs in: the harness's own is the
    # reference there.
    under_test: tuple[str, ...] = ()
    caught_by: tuple[str, ...] = ()  # checkers that catch it; empty for the reference
    ubatch_counts: tuple[int, ...] = (2, 3, 4)
    fault_kinds: tuple[FaultKind, ...] = ()  # the nemesis drawn into scenarios
    fault_every: int = 1  # about one scenario in this many carries a fault
    # About one config in this many turns microbatching off and draws draft tokens (0: none;
    # the planted microbatching bugs search where they live).
    drafts_every: int = 0
    # Fields drawn per example rather than fixed (their strategies).
    drawn: tuple[tuple[str, st.SearchStrategy], ...] = field(default=(), compare=False)
    # Only failures of these checkers count (a hunt for one class of bug); None: any.
    hunt: tuple[str, ...] | None = None
    # The fewest steps that show it: a bug of state carried from step to step needs two.
    min_steps: int = 1
    # The fewest DP ranks that show it: two survivors told apart need three (§7.25).
    min_ranks: int = 2

    def fits(self, dp_sizes: tuple[int, ...]) -> str | None:
        """Why a search over `dp_sizes` cannot show this bug, or None when it can."""
        if max(dp_sizes) >= self.min_ranks:
            return None
        return (f"{self.name} needs {self.min_ranks} DP ranks; this search has "
                f"{max(dp_sizes)}")

    @property
    def is_reference(self) -> bool:
        return not self.caught_by

    @property
    def hunts_a_shipped_class(self) -> bool:
        """A hunt for one failure class of vLLM's code as it ships (nothing planted). The
        plain `--sut vllm --exec vllm` runs one per class (EXEC_DEFAULT_HUNTS): one code shows
        both of #55586's failures under faults, and a search ends at its first. The filter
        sorts what faulted examples fail of; a fault-free example's failure is a finding of
        whatever checker it fails, or a wrong result would pass every class hunt."""
        return bool(self.hunt) and not self.is_reference and not self.mutation.planted()

    @property
    def changes(self) -> tuple[tuple[str, Any], ...]:
        """The flat config fields that plant the bug: the setting, then the mutation."""
        planted = tuple((name, wire_value(getattr(self.mutation, name)))
                        for name in self.mutation.planted())
        return (*self.setting, *planted)

    @property
    def undo(self) -> tuple[tuple[str, Any], ...]:
        """The flat fields that take the bug out: every switch the variant plants or draws
        back to Mutation()'s, and the vLLM code under test back to the harness's own."""
        drawn = {name for name, _ in self.drawn}
        switches = [f.name for f in fields(Mutation)
                    if f.name in self.mutation.planted() or f.name in drawn]
        reference, harness = Mutation(), System()
        return (*((name, wire_value(getattr(reference, name))) for name in switches),
                *((name, wire_value(getattr(harness, name))) for name in self.under_test))


CONTAINED_FAULTS = (FaultKind.RAISE_IN_UBATCH, FaultKind.RETURN_WITHOUT_YIELDING)
# The guard and staging live where twins are replayed: modes that capture FULL graphs.
TWIN_MODES_DRAWN = (("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY",
                                                        "FULL_AND_PIECEWISE"))),)
STAGING = (("staging", True),)  # the serving policy the staging slips live under (§3.4)

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("reference", "the fixed guard, reachable twins, abortable protocol, capture on the "
            "runner's stream; with contained microbatch faults now and then",
            # Drafts one config in four: at one in eight a slip in the draft query-length
            # bound took over 60 s to reach (the reach table of `make bench`).
            fault_kinds=CONTAINED_FAULTS, fault_every=8, drafts_every=4),
    Variant("guard-merged", "PR #51700 as merged (and vllm 0.33.0): eager only when "
            "2 * min < G, so a rank at exactly G / 2 replays an empty microbatch",
            mutation=Mutation(guard="merged"),
            caught_by=("no_empty_region", "captured_split", "spec_decision"),
            drawn=TWIN_MODES_DRAWN),
    Variant("guard-strict-k2", "the guard `2 * min <= G` with its literal 2: wrong for k > 2",
            mutation=Mutation(guard="strict-k2"),
            caught_by=("no_empty_region", "captured_split", "spec_decision"),
            ubatch_counts=(3, 4), drawn=TWIN_MODES_DRAWN),
    # Real-token staging (docs/spec.md §3.4): the policy itself, a reference, and two slips.
    Variant("staged-reference", "staging: a split step the fixed guard sends to eager "
            "keeps its twin, every rank's real tokens spread over every region and restored "
            "after the replay; otherwise the reference",
            setting=STAGING,
            fault_kinds=CONTAINED_FAULTS, fault_every=8, drafts_every=8),
    Variant("staging-restore-permuted", "staging, but the restore gives each region's "
            "extra token to the last regions instead of the first: a staged rank's output "
            "rows come back permuted, padding rows among them",
            mutation=Mutation(staging_restore="remainder-last"), setting=STAGING,
            caught_by=("matches_reference",), drawn=TWIN_MODES_DRAWN),
    Variant("staging-rank-local", "staging, but a rank stages when its own last region "
            "would be empty: it replays the twin while a peer whose tokens reach that region "
            "keeps the fixed guard and runs the step eagerly",
            mutation=Mutation(staging_vote="rank-local"), setting=STAGING,
            caught_by=("agreement", "routing_provenance", "errors", "spec_decision"),
            drawn=TWIN_MODES_DRAWN),
    Variant("unreachable-twins", "a microbatched twin generated for every FULL size, including "
            "sizes no legal batch can reach (captured and held for nothing)",
            mutation=Mutation(twins="all"),
            caught_by=("graphs_reachable", "spec_decision")),
    Variant("stock-protocol", "the stock microbatch protocol: a microbatch that fails after its "
            "first yield leaves its sibling waiting forever",
            mutation=Mutation(protocol="stock"),
            caught_by=("liveness", "errors"),
            fault_kinds=(FaultKind.RAISE_IN_UBATCH,)),
    Variant("capture-side-stream", "the draft of PR #51700: microbatched graphs captured on the "
            "graph context's side stream while the threads launch on the runner's stream",
            mutation=Mutation(capture_on="side"),
            # On CUDA the capture fails outright (the threads' work is illegal beside it).
            caught_by=("graphs_capture_work", "matches_reference", "startup")),
    Variant("asymmetric-candidates", "one rank derives its twins with a shifted decode "
            "threshold, so the ranks capture different graphs",
            caught_by=("capture_symmetry", "agreement", "startup", "spec_decision"),
            # The mutation is drawn: which rank, and how far its threshold moves.
            drawn=(("threshold_offset_rank", st.integers(0, 1)),
                   ("threshold_offset", st.integers(1, 32)))),
    Variant("a2a-unpadded-sizes", "the all-to-all buffers sized from each microbatch's own "
            "unpadded token count, so ranks with different real tokens exchange different "
            "sizes (gloo aborts the process that receives more than it expects)",
            mutation=Mutation(a2a_buffers="unpadded"),
            caught_by=("errors", "startup")),
    # vLLM's bug history (docs/spec.md §7.12-7.15).
    Variant("twin-stored-under-two-ubatches", "vLLM issue #43145: a microbatched graph is "
            "stored under the tokens of its first two microbatches and looked up by the "
            "total, so with k >= 3 it is never found and the step runs eagerly",
            mutation=Mutation(capture_key="first-two"),
            caught_by=("executes_plan",), ubatch_counts=(3,),
            # The bug lives where twins are captured: no mode without FULL graphs.
            drawn=(("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY"))),)),
    Variant("eager-step-graph-padded-slices", "vLLM PR #29933: a split step that replays no "
            "graph runs microbatch slices padded as a graph's, to requests it does not have",
            mutation=Mutation(eager_slices="graph-padded"),
            caught_by=("eager_slices",)),
    Variant("a2a-buffers-sized-for-a-microbatch", "vLLM issue #52176: the all-to-all buffers "
            "take one microbatch of the largest batch, so a step that does not split runs "
            "a batch larger than the buffers",
            mutation=Mutation(a2a_buffers="microbatch"),
            caught_by=("dispatch_capacity", "startup", "errors")),
    Variant("idle-rank-dummy-unpadded", "vLLM issue #26137: an idle rank's dummy batch "
            "runs at its own size instead of the token count the ranks agreed on, so it "
            "replays (or runs) another graph than its peers",
            mutation=Mutation(dummy_padding="unpadded"),
            caught_by=("executes_plan",),
            # Without graphs nobody pads, and with one graph the dummy's own is the agreed
            # one: only modes that capture graphs, two sizes at least, can show it.
            drawn=(("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY",
                                                       "FULL_AND_PIECEWISE"))),
                   ("capture_sizes", st.lists(st.sampled_from(SIZE_CHOICES), min_size=2,
                                              max_size=2, unique=True).map(sorted)))),
    Variant("rank-local-ubatch-opt-out", "a rank with fewer requests than microbatches leaves "
            "the split on its own, a value no other rank consults; its peers wait in "
            "all-to-alls it never joins (vLLM PR #50945's review)",
            mutation=Mutation(ubatch_vote="rank-local"),
            caught_by=("split_consensus", "agreement", "errors", "spec_decision")),
    Variant("rank-local-query-len-bound", "with draft tokens and varlen decode graphs, a rank "
            "dispatches with its own query-length bound instead of the synced one, so a decode "
            "rank replays a varlen decode graph its peers with a prefill cannot "
            "(docs/spec.md §7.17)",
            mutation=Mutation(query_len_bound="rank-local"),
            caught_by=("agreement", "executes_plan", "errors", "spec_decision"),
            # The bug lives where varlen decode graphs exist: drafts (so no microbatching)
            # and a separate decode routine whose mixed steps still pad (PIECEWISE).
            drawn=(("enable_dbo", st.just(False)), ("ubatch_size", st.just(0)),
                   ("decode_query_len", st.integers(2, 4)), ("varlen_decode", st.just(True)),
                   ("cudagraph_mode", st.sampled_from(("FULL_AND_PIECEWISE",))))),
    # vLLM's bug history, round two (docs/spec.md §7.18-).
    Variant("continuation-stale-computed", "vLLM #56031: a request split across microbatches "
            "counts, on its continuation slice, only the tokens cached before the step, not "
            "those its earlier microbatches ran (24 where it should be 28)",
            mutation=Mutation(continuation="stale"), caught_by=("matches_reference",),
            # Where requests straddle a split: eager microbatched steps with prefills.
            drawn=(("cudagraph_mode", st.just("NONE")),)),
    Variant("replay-lookback-stale", "vLLM #56440: a replay writes each microbatch's "
            "cached-token counts into fresh storage, so the graph reads those of an earlier "
            "run: a request with history gets the wrong positions at replay",
            mutation=Mutation(lookback_refresh="rebind"), caught_by=("matches_reference",),
            min_steps=2,
            # Graphs to replay: the bug lives in modes that capture FULL graphs.
            drawn=(("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY"))),)),
    Variant("idle-rank-returns-early", "vLLM #43547 (#44601, #53578): a rank with no token "
            "returns from the step before the DP sync and the dummy forward, so its "
            "collectives drift from its peers' (in vLLM a MoE collective hung an hour later)",
            mutation=Mutation(idle_step="skip"),
            caught_by=("collective_fingerprints", "errors", "liveness")),
    Variant("idle-dummy-eager-beside-replay", "ROCm/ATOM #1697: an idle rank runs its dummy "
            "batch eagerly and unsplit while its peers replay a graph with its collectives "
            "baked in, so the tail of a microbatched step waits for a peer that moved on",
            mutation=Mutation(dummy_execution="eager"),
            caught_by=("executes_plan", "errors", "liveness"),
            drawn=(("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY"))),)),
    Variant("draft-sync-state-rank-local", "vLLM #53694 / #54856: the DP sync state the "
            "drafter reuses keeps the rank's own request count on a step with drafts, a "
            "per-rank value in state every rank must hold alike",
            mutation=Mutation(draft_sync_state="rank-local"),
            caught_by=("agreement", "spec_decision"),
            # Drafts exist only with microbatching off.
            drawn=(("enable_dbo", st.just(False)), ("ubatch_size", st.just(0)),
                   ("decode_query_len", st.integers(2, 4)))),
    Variant("dead-set-rank-local", "vllm 0.34.0's DP sync under fault tolerance leaves out "
            "only the dead ranks this rank was told of: a survivor told later than another "
            "agrees over the dead rank's zero column (an eager vote, no tokens)",
            mutation=Mutation(dead_set="rank-local"), setting=(("fault_tolerance", True),),
            caught_by=("dead_slots_left_out",), min_ranks=3),
    Variant("verify-slices-upper-bound", "vllm 0.34.0's create_ubatch_slices under adaptive "
            "verification: requests are cut by the untrimmed scheduled counts, so a "
            "microbatch's request slice can end before a request whose tokens it runs "
            "(docs/spec.md §7.24)",
            mutation=Mutation(verify_slices="upper-bound"),
            caught_by=("tokens_in_their_requests", "matches_reference"),
            # Adaptive verification: drafts and varlen decode graphs (FULL_AND_PIECEWISE).
            drawn=(("decode_query_len", st.integers(2, 4)), ("varlen_decode", st.just(True)),
                   ("cudagraph_mode", st.just("FULL_AND_PIECEWISE")))),
    Variant("replay-identity-captured-once", "DeepGEMM #451: a graph bakes in the readiness "
            "tag the host knew at capture, so every replay ships an earlier run's tag and "
            "its receivers take stale blocks as fresh",
            mutation=Mutation(replay_tag="captured"), caught_by=("fresh_receive",),
            drawn=(("cudagraph_mode", st.sampled_from(("FULL", "FULL_DECODE_ONLY"))),)),
)}


# Other systems under test, fuzzed with `--sut`: not in `--variant all`, which needs only the
# harness. vllm 0.33.0 ships the merged guard, so its fuzzing is expected to find it.
SUT_VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("vllm", "the installed vLLM's own candidates, dispatch, thresholds and DP sync "
            "in the decision slots; the model, protocol, graphs and checkers the harness's",
            setting=(("sut", "vllm"),), under_test=("sut",),
            # differential_base first: with --differential-against base, a decision a fix
            # was not meant to change is named as such (differential fails there too).
            caught_by=("differential_base", "no_empty_region", "dead_slots_left_out",
                       "differential", "captured_split", "graphs_reachable"), drafts_every=8),
)}


# vLLM's own execution code (`--exec vllm`): with its decisions (`--sut vllm`) the search
# hunts each failure class of its microbatch threads under faults at every stage of their
# life; with the harness's decisions, a fault-free search must hold every checker.
EXEC_FAULTS = (FaultKind.RAISE_IN_UBATCH, FaultKind.RETURN_WITHOUT_YIELDING, *VLLM_EXEC_FAULTS)
# The faults fire in microbatch threads, which run in eager microbatched steps (a replay
# runs none): eager configs whose every rank splits from 4 tokens on.
EXEC_HUNT_DRAWN = (("cudagraph_mode", st.just("NONE")), ("decode_threshold", st.just(4)),
                   ("prefill_threshold", st.just(4)))
EXEC_VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("vllm-exec-hang", "vllm's UBatchRunner and ubatching contexts under microbatch "
            "faults: a step that never ends (a microbatch parked for a handoff nobody makes)",
            setting=(("sut", "vllm"), ("execution", "vllm")), under_test=("execution",),
            caught_by=("liveness",), hunt=("liveness",),
            fault_kinds=EXEC_FAULTS, ubatch_counts=(2, 3), drawn=EXEC_HUNT_DRAWN),
    Variant("vllm-exec-crash", "vllm's UBatchRunner and ubatching contexts under microbatch "
            "faults: a thread no fault was injected into crashes of its own",
            setting=(("sut", "vllm"), ("execution", "vllm")), under_test=("execution",),
            caught_by=("errors",), hunt=("errors",),
            fault_kinds=EXEC_FAULTS, ubatch_counts=(2, 3),
            # Where a thread dereferences a sibling's slot: the receive hooks of low latency.
            drawn=(*EXEC_HUNT_DRAWN, ("all2all_backend", st.just("deepep_low_latency")))),
    Variant("vllm-exec", "the harness's decisions executed by vllm's UBatchRunner, ubatching "
            "contexts and ModelCudaGraphManager, fault-free: every checker must hold",
            setting=(("execution", "vllm"),), under_test=("execution",)),
    # A planted slip (docs/spec.md §11), named alone: `all` hunts vLLM as it ships.
    Variant("ht-missing-compute-wait", "the high-throughput all-to-all returns to compute "
            "with vllm's dbo_switch_to_compute, no event wait, so the compute stream reads "
            "the comm stream's receive unordered (right rows on CPU, a race on a GPU)",
            setting=(("sut", "vllm"), ("execution", "vllm")),
            mutation=Mutation(switch_to_compute="no-wait"), caught_by=("stream_order",),
            hunt=("stream_order",), ubatch_counts=(2, 3),
            drawn=(*EXEC_HUNT_DRAWN, ("all2all_backend", st.just("deepep_high_throughput")))),
    # ROCm/ATOM PR #1208's race (docs/spec.md §11.5), in either all-to-all style.
    Variant("ids-gather-early-wait", "the top-k ids all-gather on the comm stream waits "
            "only on an event recorded before the router wrote the ids, so it reads them "
            "unordered (right rows on CPU, stale routing on a GPU)",
            setting=(("sut", "vllm"), ("execution", "vllm")),
            mutation=Mutation(ids_gather_wait="before-routing"), caught_by=("stream_order",),
            hunt=("stream_order",), ubatch_counts=(2, 3), drawn=EXEC_HUNT_DRAWN),
)}
# What `--sut vllm --exec vllm --variant all` hunts: vLLM's execution code as it ships.
EXEC_DEFAULT_HUNTS = ("vllm-exec-hang", "vllm-exec-crash")

# The reference's search where vLLM's code executes the steps (docs/spec.md §10.4): its faults
# are the stages of a microbatch thread's life, and a thread runs only in an eager
# microbatched step, so the configs lean there. Half the configs capture no graph; the
# thresholds and request limit are drawn low, so that a step of the fuzzer's few tokens
# splits; four microbatches, which seldom split such a step, are drawn one config in five.
# The overlap style is drawn (high throughput needs NONE: its other draws are rejected).
EXEC_REFERENCE_FAULT_EVERY = 2  # a fault-free scenario still shows a slip in the streams
EXEC_REFERENCE_DRAFTS_EVERY = 8
EXEC_REFERENCE_UBATCH_COUNTS = (2, 3, 2, 3, 4)
EXEC_REFERENCE_DRAWN = (
    ("cudagraph_mode", st.sampled_from(("NONE", "NONE", "NONE", "FULL", "FULL_DECODE_ONLY",
                                        "FULL_AND_PIECEWISE"))),
    ("all2all_backend", st.sampled_from(("deepep_low_latency", "deepep_high_throughput"))),
    ("decode_threshold", st.sampled_from((4, 4, 8, 16))),
    ("prefill_threshold", st.sampled_from((4, 4, 8, 16, 32))),
    ("max_num_reqs", st.sampled_from((64, 64, 32))))


def executing_vllm(reference: Variant) -> Variant:
    """`reference`'s search where vLLM's own code executes the steps: every fault of a
    microbatch thread's life, drawn where the threads run."""
    return replace(reference, fault_kinds=EXEC_FAULTS, fault_every=EXEC_REFERENCE_FAULT_EVERY,
                   drafts_every=EXEC_REFERENCE_DRAFTS_EVERY,
                   ubatch_counts=EXEC_REFERENCE_UBATCH_COUNTS,
                   drawn=(*EXEC_REFERENCE_DRAWN, *reference.drawn))


def executes_vllm(setting: tuple[tuple[str, Any], ...]) -> bool:
    return ("execution", "vllm") in setting


def reference_for(setting: tuple[tuple[str, Any], ...]) -> Variant:
    """The reference whose search hunts a bug living in `setting`: under vLLM's execution,
    `executing_vllm`'s; else the reference as it is."""
    reference = VARIANTS["reference"]
    return executing_vllm(reference) if executes_vllm(setting) else reference


def _known(variant_name: str) -> Variant | None:
    return (VARIANTS.get(variant_name) or SUT_VARIANTS.get(variant_name)
            or EXEC_VARIANTS.get(variant_name))


def expects_a_finding(variant_name: str) -> bool:
    """A planted (or shipped) bug must be found; the reference must stay clean."""
    variant = _known(variant_name)
    return variant is not None and not variant.is_reference


FOUND, NOT_FOUND = "found", "not found"


def detection(caught_by: tuple[str, ...], found: bool, checker: str | None) -> str:
    """A search's result against the checkers that name its bug: "found" only when one of
    them fired; "found as X" when checker X fired instead (a miss: the bug did not show as
    itself); else "not found". The one rule for every table, report and exit code."""
    if not found:
        return NOT_FOUND
    return FOUND if checker in caught_by else f"found as {checker}"


def did_its_job(variant_name: str, found: bool, checker: str | None) -> bool:
    """A planted bug must be found as itself; the reference (any finding fails it), or a
    variant this version does not know, must stay clean."""
    variant = _known(variant_name)
    if variant is None or variant.is_reference:
        return not found
    return detection(variant.caught_by, found, checker) == FOUND


def variant_detection(variant_name: str, found: bool, checker: str | None) -> str:
    """`detection` by the checkers the named variant is known by (none for the reference)."""
    variant = _known(variant_name)
    return detection(variant.caught_by if variant else (), found, checker)


def variant_named(name: str) -> Variant:
    try:
        return VARIANTS.get(name) or SUT_VARIANTS.get(name) or EXEC_VARIANTS[name]
    except KeyError:
        raise ConfigError("variant", f"unknown variant {name!r} (one of "
                          f"{', '.join(VARIANTS)}, or all)") from None
