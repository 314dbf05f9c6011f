"""The frozen parts a HarnessConfig is made of (docs/spec.md §0): how vLLM serves (Serving, its
policies such as real-token staging among them), the model's shape (Model), the bug planted in
the system under test (Mutation; Mutation() plants none: the reference) and whose code decides
and executes the steps (System).

Each part parses its own fields' wire values; the rules across parts live in HarnessConfig.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from harness.bug_switches import (
    A2ABuffers,
    CaptureKey,
    CaptureOn,
    Continuation,
    DeadSet,
    DraftSyncState,
    DummyExecution,
    DummyPadding,
    EagerSlices,
    Guard,
    IdleStep,
    IdsGatherWait,
    LookbackRefresh,
    QueryLenBound,
    ReplayTag,
    StagingRestore,
    StagingVote,
    SwitchToCompute,
    Twins,
    UbatchVote,
    VerifySlices,
)
from harness.config_values import parse_enum
from harness.errors import ConfigError
from harness.vllm_code.release import Release
from harness.vllm_code.source import VllmPatch, parse_patches


class CudaGraphMode(enum.Enum):
    """vLLM's CUDAGraphMode: three runtime modes and two composite ones (decode, mixed)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CudaGraphMode:
        return CudaGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CudaGraphMode:
        return CudaGraphMode(self.value[1]) if self.separate_routine() else self

    @classmethod
    def parse(cls, name: str | CudaGraphMode, field_name: str = "cudagraph_mode") -> CudaGraphMode:
        if isinstance(name, CudaGraphMode):
            return name
        try:
            return cls[str(name).upper()]
        except KeyError:
            names = ", ".join(m.name for m in cls)
            raise ConfigError(field_name, f"unknown mode {name!r} (one of {names})") from None


class UbatchProtocol(enum.Enum):
    """Which microbatch thread protocol runs eager microbatched steps (docs/spec.md §5.5-5.6)."""

    ABORTABLE = "abortable"  # a failing microbatch unwinds its siblings: the reference
    STOCK = "stock"  # vLLM as merged: spec §7.4 (sibling hang), §7.3 (recv_hook on None)


class All2AllBackend(enum.Enum):
    """How the MoE layer overlaps its all-to-alls (docs/spec.md §5.4)."""

    LOW_LATENCY = "deepep_low_latency"  # async send, receive as a hook run by the next ubatch
    HIGH_THROUGHPUT = "deepep_high_throughput"  # yield first, then a blocking all-to-all


class DecisionSystem(enum.Enum):
    """Whose decision code the ranks run: candidates, dispatch, thresholds and the DP sync."""

    HARNESS = "harness"  # the harness's miniature, with its variant switches
    VLLM = "vllm"  # the installed vLLM's own functions (harness/vllm_sut)


class Execution(enum.Enum):
    """Whose code runs a decided step: microbatch threads, handoffs, capture, replay."""
    HARNESS = "harness"  # the harness's runner, ring protocol and graph manager
    VLLM = "vllm"  # vLLM's UBatchRunner, UBatchContexts and ModelCudaGraphManager (vllm_exec)


def _enum(enum_cls: type[enum.Enum]) -> Callable[[Any, str], Any]:
    return lambda value, name: parse_enum(enum_cls, value, name)


def _draft_schedule(value: Any, name: str) -> tuple[tuple[int, int], ...] | None:
    """[[q, most requests], ...]: checked in full by config_values.check_draft_schedule."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(
            isinstance(pair, list | tuple) and len(pair) == 2 for pair in value):
        raise ConfigError(name, f"must be a list of [query length, most requests] pairs, "
                          f"got {value!r}")
    return tuple(tuple(pair) for pair in value)


def _capture_sizes(value: Any, name: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ConfigError(name, f"must be a list of positive integers, got {value!r}")
    return tuple(value)


# How each field's wire value is parsed, in the order a flat config is parsed (so the same
# input names the same field first).
PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "cudagraph_mode": CudaGraphMode.parse, "sut": _enum(DecisionSystem),
    "execution": _enum(Execution), "vllm_patches": lambda value, _: parse_patches(value),
    "guard": _enum(Guard), "twins": _enum(Twins), "protocol": _enum(UbatchProtocol),
    "all2all_backend": _enum(All2AllBackend), "capture_on": _enum(CaptureOn),
    "capture_key": _enum(CaptureKey), "eager_slices": _enum(EagerSlices),
    "a2a_buffers": _enum(A2ABuffers), "ubatch_vote": _enum(UbatchVote),
    "dummy_padding": _enum(DummyPadding), "query_len_bound": _enum(QueryLenBound),
    "switch_to_compute": _enum(SwitchToCompute), "capture_sizes": _capture_sizes,
    "staging_restore": _enum(StagingRestore), "staging_vote": _enum(StagingVote),
    "continuation": _enum(Continuation), "lookback_refresh": _enum(LookbackRefresh),
    "idle_step": _enum(IdleStep), "dummy_execution": _enum(DummyExecution),
    "draft_sync_state": _enum(DraftSyncState), "replay_tag": _enum(ReplayTag),
    "ids_gather_wait": _enum(IdsGatherWait), "release": _enum(Release),
    "draft_schedule": _draft_schedule, "verify_slices": _enum(VerifySlices),
    "dead_set": _enum(DeadSet),
}


def _parse_fields(part: Any) -> None:
    for f in fields(part):
        if f.name in PARSERS:
            object.__setattr__(part, f.name, PARSERS[f.name](getattr(part, f.name), f.name))


def wire_value(value: Any) -> Any:
    """A parsed field's value as the file form writes it."""
    if isinstance(value, CudaGraphMode):
        return value.name
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [v.to_dict() if isinstance(v, VllmPatch) else
                list(v) if isinstance(v, tuple) else v for v in value]
    return value


@dataclass(frozen=True)
class Serving:
    """How vLLM serves the steps: DP size, microbatching, thresholds, graphs and limits."""

    dp_size: int = 2
    # vLLM semantics: enable_dbo forces 2 microbatches, else ubatch_size > 1 gives that many.
    enable_dbo: bool = True
    ubatch_size: int = 0
    decode_threshold: int = 32
    prefill_threshold: int = 512
    cudagraph_mode: CudaGraphMode = CudaGraphMode.FULL
    # None: generated from max_num_reqs and max_num_batched_tokens (docs/spec.md §0.3).
    capture_sizes: tuple[int, ...] | None = None
    max_num_reqs: int = 64
    max_num_batched_tokens: int = 256
    # Tokens of a decode request: 1 + draft tokens (with microbatching from 0.34 on only);
    # varlen_decode: adaptive verification.
    decode_query_len: int = 1
    varlen_decode: bool = False
    # Dynamic speculative decoding (0.34): (q, most requests) pairs, batches of up to that
    # many requests drafting q - 1 tokens (vLLM's get_decode_cudagraph_query_lens); None: one q.
    draft_schedule: tuple[tuple[int, int], ...] | None = None
    all2all_backend: All2AllBackend = All2AllBackend.LOW_LATENCY
    release: Release = Release.V0_34
    # vLLM's enable_fault_tolerance (0.34): a DP rank may die mid-run; the survivors leave
    # the dead ranks' columns out of the sync's agreements once they learn (§1.7).
    fault_tolerance: bool = False
    # Real-token staging (PR #57184's idea, docs/spec.md §3.4): where the fixed guard falls
    # back to eager, every rank lays its real tokens over every region and keeps the twin.
    staging: bool = False
    # The GPU suite's world of one rank (one GPU): microbatching with dp_size 1, whose
    # all-to-all is a size-one NCCL op. Allowed nowhere else.
    single_rank_gpu_world: bool = False

    def __post_init__(self) -> None:
        _parse_fields(self)


@dataclass(frozen=True)
class Model:
    """The miniature MoE model's shape and weights' seed."""

    hidden_size: int = 16
    experts_per_rank: int = 2  # experts are sharded evenly: dp_size * experts_per_rank in all
    top_k: int = 2
    seed: int = 0


# Which code a switch of the mutation changes: some exist only in the harness's own.
DECISION = "decision"  # the harness's decisions: the vllm system under test brings its own
EXECUTION = "execution"  # the harness's execution: vLLM's runner and graph manager bring theirs


def _switch(default: Any, code: str | None = None) -> Any:
    return field(default=default, metadata={"code": code})


@dataclass(frozen=True)
class Mutation:
    """The known bug planted in the system under test (docs/spec.md §7): each default is the
    reference behaviour, so Mutation() plants none."""

    guard: Guard = _switch(Guard.FIXED, DECISION)
    twins: Twins = _switch(Twins.REACHABLE, DECISION)
    # This rank generates twins with the decode threshold moved by the offset (the switch is
    # the rank; the offset alone moves nothing).
    threshold_offset_rank: int | None = _switch(None, DECISION)
    threshold_offset: int = _switch(0)
    protocol: UbatchProtocol = _switch(UbatchProtocol.ABORTABLE, EXECUTION)
    capture_on: CaptureOn = _switch(CaptureOn.RUNNER, EXECUTION)
    # Bugs of vLLM's history (docs/spec.md §7.12-7.15).
    capture_key: CaptureKey = _switch(CaptureKey.TOTAL, EXECUTION)
    eager_slices: EagerSlices = _switch(EagerSlices.OWN, EXECUTION)
    a2a_buffers: A2ABuffers = _switch(A2ABuffers.MAX_TOKENS)
    ubatch_vote: UbatchVote = _switch(UbatchVote.SYNCED, DECISION)
    dummy_padding: DummyPadding = _switch(DummyPadding.AGREED, EXECUTION)
    query_len_bound: QueryLenBound = _switch(QueryLenBound.SYNCED, DECISION)
    # vLLM's execution, high throughput: whether compute waits for the all-to-all (§11).
    switch_to_compute: SwitchToCompute = _switch(SwitchToCompute.SYNC)
    # Real-token staging's slips (docs/spec.md §3.4); inert unless Serving.staging is on.
    staging_restore: StagingRestore = _switch(StagingRestore.INVERSE, EXECUTION)
    staging_vote: StagingVote = _switch(StagingVote.SYNCED, DECISION)
    # A request split across microbatches (docs/spec.md §7.18-7.19): what its continuation
    # counts as cached, and whether a replay refreshes those counts where the graph reads.
    continuation: Continuation = _switch(Continuation.COUNTED, EXECUTION)
    lookback_refresh: LookbackRefresh = _switch(LookbackRefresh.IN_PLACE, EXECUTION)
    # Idle ranks (docs/spec.md §7.20-7.21): whether one joins the step, and how it runs the
    # graph its peers replay.
    idle_step: IdleStep = _switch(IdleStep.DUMMY, EXECUTION)
    dummy_execution: DummyExecution = _switch(DummyExecution.AGREED, EXECUTION)
    # The sync state the drafter reuses (docs/spec.md §7.22).
    draft_sync_state: DraftSyncState = _switch(DraftSyncState.SYNCED, DECISION)
    # Where a dispatch's readiness tag comes from at replay (docs/spec.md §7.23).
    replay_tag: ReplayTag = _switch(ReplayTag.PER_RUN, EXECUTION)
    # vLLM's execution, microbatched: whether the comm stream's all-gather of the top-k
    # ids waits for the router's write of them (§11.5).
    ids_gather_wait: IdsGatherWait = _switch(IdsGatherWait.AFTER_ROUTING)
    # Under adaptive verification: what the split counts requests by (§7.24).
    verify_slices: VerifySlices = _switch(VerifySlices.ACTUAL, EXECUTION)
    # Under fault tolerance: which dead ranks a rank leaves out of the agreements (§7.25).
    dead_set: DeadSet = _switch(DeadSet.SHARED, DECISION)

    def __post_init__(self) -> None:
        _parse_fields(self)

    @classmethod
    def switches_of(cls, code: str) -> tuple[str, ...]:
        """The switches of the harness's own decision (or execution) code."""
        return tuple(f.name for f in fields(cls) if f.metadata["code"] == code)

    def planted(self) -> tuple[str, ...]:
        """The switches this mutation moves off the reference."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) != f.default)


@dataclass(frozen=True)
class System:
    """The system under test: whose decisions and execution run, and which vLLM code."""

    sut: DecisionSystem = DecisionSystem.HARNESS
    # Whose code executes the decided step (`--exec`): the harness's or vLLM's own.
    execution: Execution = Execution.HARNESS
    # sut vllm only: a checkout's decision modules, diffs applied over them in memory, and
    # the unpatched vLLM's decisions held up beside the reference (harness/vllm_sut/code.py).
    vllm_src: str | None = None
    vllm_patches: tuple[VllmPatch, ...] = ()
    differential_against_base: bool = False

    def __post_init__(self) -> None:
        _parse_fields(self)


# Serving policies a planted switch may live under (the staging_* slips need staging on):
# part of such a bug, where other serving fields are where a search looks.
POLICIES = ("staging",)

PARTS: dict[str, type] = {"serving": Serving, "model": Model, "mutation": Mutation,
                          "system": System}
# Each flat field (the wire form's name) and the part that holds it.
PART_OF: dict[str, str] = {f.name: part for part, cls in PARTS.items() for f in fields(cls)}
